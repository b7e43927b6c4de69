# The pdwarden operator: kopf + the Kubernetes client, no torch, no NIXL.
#   docker build -f images/operator.Dockerfile -t ghcr.io/pdwarden/pdwarden:0.1.0 .
# The chart runs it as `pdwarden run ...` (command and args set there), as UID 65532 with a
# read-only root filesystem.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY worker/ worker/
# One distribution holds both packages; without the [worker] extra it pulls no torch/NIXL.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
# The project's own source: its dependency ranges live in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-index --find-links=/wheels pdwarden \
    && rm -rf /wheels
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["pdwarden"]
CMD ["run"]

# pdworker on CPU: torch (CPU wheels) + NIXL over UCX. Runs the local/kind examples (gpus: 0).
#   docker build -f images/worker-cpu.Dockerfile -t ghcr.io/pdwarden/pdworker:0.1.0-cpu .
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY worker/ worker/
# CPU torch first so the [worker] extra does not pull the CUDA build; nixl-cu12 runs on CPU.
# The project's own source: its dependency ranges live in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.4" \
    && pip install ".[worker]" \
    && rm -rf /src
WORKDIR /
USER 65532:65532
EXPOSE 8000 8998
ENTRYPOINT ["pdworker"]

# pdworker on NVIDIA GPUs: CUDA 12 runtime, torch (cu12 wheels) + NIXL (nixl-cu12, UCX backend).
#   docker build -f images/worker-cuda.Dockerfile -t ghcr.io/pdwarden/pdworker:0.1.0-cuda12 .
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/pdworker \
    PATH=/opt/pdworker/bin:$PATH
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/pdworker
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY worker/ worker/
# The project's own source: its dependency ranges live in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install --extra-index-url https://download.pytorch.org/whl/cu128 ".[worker]" \
    && rm -rf /src
WORKDIR /
USER 65532:65532
EXPOSE 8000 8998
ENTRYPOINT ["pdworker"]

#!/usr/bin/env bash
# Builds (or reuses) a separate virtual environment with stock SGLang, its router and NIXL, in a
# cache outside the repository keyed by the pinned versions, like the vLLM tier's. The SGLang e2e
# tier (e2e/tests/test_sglang_real.py) and the process kubelet's `sglang` image run
# `python3 -m sglang.launch_server` and `python3 -m sglang_router.launch_router` from it. Prints
# the venv's directory.
#
#   e2e/sglang/build.sh           build (or reuse) the venv, print its path
#   e2e/sglang/build.sh --lock    re-resolve requirements.lock from versions.env (needs the index)
#   PDWARDEN_CACHE=...            cache root (default ~/.cache/pdwarden)
#
# What is left out: the GPU-only kernels SGLang depends on (FlashInfer, flash-attn, DeepEP,
# DeepGEMM, FlashMLA, TileLang, the CUTLASS DSL, quack, nvshmem4py, sgl-kernel) and audio/video
# (torchaudio, torchcodec): a CPU server of a text model imports none of them on its path. torch
# is PyPI's CUDA build, which runs on CPU. The CPU image's pieces that are not SGLang's (cpu_image/:
# a pure-torch `sgl_kernel` with the two ops the CPU path calls, and the NIXL memory-type hook)
# are installed into the venv's site-packages and refreshed whenever the repository's copy
# changes, without a rebuild. The venv is built under a temporary name, then renamed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
lock=$here/requirements.lock
uv=$("$here/../uv.sh")
python=${PYTHON:-python3}

excluded=(flashinfer-python flashinfer-cubin flashinfer-jit-cache flash-attn flash-attn-4
  nvidia-cutlass-dsl deep-ep deep-gemm flash-mla sgl-deep-ep sgl-deep-gemm sgl-flash-mla tilelang
  quack-kernels nvshmem4py-cu13 torchaudio torchcodec sgl-kernel sglang-kernel humming-kernels)

if [ "${1:-}" = "--lock" ]; then
  tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
  for p in "${excluded[@]}"; do printf '%s; python_version < "0"\n' "$p"; done >"$tmp/overrides.txt"
  printf 'torch==%s\n' "$TORCH_VERSION" >>"$tmp/overrides.txt"
  printf 'sglang==%s\nsglang-router==%s\nnixl==%s\n' \
    "$SGLANG_VERSION" "$SGLANG_ROUTER_VERSION" "$NIXL_VERSION" >"$tmp/requirements.in"
  "$uv" pip compile --quiet --no-header --python "$python" --python-version 3.11 \
    --override "$tmp/overrides.txt" "$tmp/requirements.in" -o "$tmp/lock"
  { echo "# Every package of the SGLang tier's venv, resolved by e2e/sglang/build.sh --lock from"
    echo "# versions.env without GPU-only kernels. Installed with --no-deps: nothing else is."
    grep -v '^ *#' "$tmp/lock"; } >"$lock"
  echo "$lock"
  exit 0
fi

cache=${PDWARDEN_CACHE:-$HOME/.cache/pdwarden}
key=$( (cat "$here/versions.env" "$lock") | sha256sum | cut -c1-12)
venv=$cache/sglang-$SGLANG_VERSION-torch-$TORCH_VERSION-nixl-$NIXL_VERSION-$key
done_marker=$venv/.pdwarden-complete

install_cpu_image() {  # venv: the CPU image's own pieces, refreshed when they change
  local site
  site=$(echo "$1"/lib/python3.*/site-packages)
  mkdir -p "$site/sgl_kernel"
  cmp -s "$here/cpu_image/sgl_kernel.py" "$site/sgl_kernel/__init__.py" ||
    install -m 0644 "$here/cpu_image/sgl_kernel.py" "$site/sgl_kernel/__init__.py"
  cmp -s "$here/cpu_image/nixl_host_memory.py" "$site/pdwarden_nixl_host_memory.py" ||
    install -m 0644 "$here/cpu_image/nixl_host_memory.py" "$site/pdwarden_nixl_host_memory.py"
  echo "import pdwarden_nixl_host_memory" >"$site/pdwarden_nixl_host_memory.pth"
  # The vLLM tier's NIXL progress-thread delay: SGLang's NIXL agents spin the same way.
  cmp -s "$here/../vllm/nixl_progress_delay.py" "$site/pdwarden_nixl_progress_delay.py" ||
    install -m 0644 "$here/../vllm/nixl_progress_delay.py" "$site/pdwarden_nixl_progress_delay.py"
  echo "import pdwarden_nixl_progress_delay" >"$site/pdwarden_nixl_progress_delay.pth"
}

if [ -e "$done_marker" ] && [ -x "$venv/bin/python" ]; then
  install_cpu_image "$venv"
  echo "$venv"
  exit 0
fi

say() { printf '[sglang-venv %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.sglang-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
build=$tmp/venv
say "building sglang $SGLANG_VERSION + torch $TORCH_VERSION + nixl $NIXL_VERSION into $venv (cold: ~7 GB downloaded, minutes; later runs reuse it)"
t=$(date +%s)
"$uv" venv --quiet --relocatable --python "$(command -v "$python")" "$build"
VIRTUAL_ENV=$build "$uv" pip install --quiet --no-deps --python "$build/bin/python" -r "$lock"
install_cpu_image "$build"
"$build/bin/python" - <<'PY'
import nixl._api  # noqa: F401  the NIXL binding loads (UCX backend on CPU)
import sglang_router  # noqa: F401
import sglang.srt.entrypoints.http_server  # noqa: F401  the server's imports resolve
PY
date -u +%Y-%m-%dT%H:%M:%SZ >"$build/.pdwarden-complete"
rm -rf "$venv"
mv "$build" "$venv"
say "built in $(( $(date +%s) - t ))s"
echo "$venv"

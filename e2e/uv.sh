#!/usr/bin/env bash
# Installs (or reuses) the pinned uv that builds the engine tiers' venvs (e2e/vllm/build.sh,
# e2e/sglang/build.sh) into the cache, and prints its path. One pin for both tiers.
#
#   PDWARDEN_CACHE=...  cache root (default ~/.cache/pdwarden)
set -euo pipefail
UV_VERSION=0.13.9
cache=${PDWARDEN_CACHE:-$HOME/.cache/pdwarden}
uv_dir=$cache/uv-$UV_VERSION
if [ ! -x "$uv_dir/bin/uv" ]; then
  printf '[uv %s] installing uv %s into %s\n' "$(date +%H:%M:%S)" "$UV_VERSION" "$uv_dir" >&2
  mkdir -p "$cache"
  rm -rf "$uv_dir.tmp"
  "${PYTHON:-python3}" -m pip install --quiet --disable-pip-version-check --target "$uv_dir.tmp" \
    "uv==$UV_VERSION"
  rm -rf "$uv_dir" && mv "$uv_dir.tmp" "$uv_dir"
fi
echo "$uv_dir/bin/uv"

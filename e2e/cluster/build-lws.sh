#!/usr/bin/env bash
# Builds LeaderWorkerSet's own controller manager (sigs.k8s.io/lws, its cmd/ main) from the Go
# module proxy into the same cache as the control plane, keyed by version, with the CRDs of the
# same module next to it. Skips what is present. The e2e scenarios of PDRemediationPolicy over
# LWS-owned pods (e2e/tests/test_policy_lws.py) run it against the local cluster (e2e/lws.py).
#
#   e2e/cluster/build-lws.sh      build (or reuse) lws-manager, print its bin dir
#   PDWARDEN_CACHE=...            cache root (default ~/.cache/pdwarden)
#
# `go install sigs.k8s.io/lws/cmd@VERSION` would name the binary `cmd` and needs the proxy's
# version list; instead the module is downloaded (`go mod download`, a no-op when cached) and
# built inside its own directory with its own go.mod and go.sum, so every dependency version is
# LWS's. Cold (modules downloaded, nothing compiled): ~25 min on 2 cores; with the control
# plane's Go build cache warm (shared client-go, apimachinery, controller-runtime deps) measured
# 4.6 min at load 9; a relink alone ~10 s.
set -euo pipefail

LWS_VERSION=v0.9.0

cache=${PDWARDEN_CACHE:-$HOME/.cache/pdwarden}
bin=$cache/lws-$LWS_VERSION/bin
crds=$bin/crds
mkdir -p "$crds"
exec 9>"$cache/.build-lws.lock"  # one build at a time per cache (see build.sh)
flock 9
if [ -x "$bin/lws-manager" ] && [ -e "$crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml" ]; then
  echo "$bin"
  exit 0
fi
say() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
dir=$(go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { say "go mod download sigs.k8s.io/lws@$LWS_VERSION gave no module directory"; exit 1; }
install -m 0644 "$dir"/config/crd/bases/*.yaml "$crds/"
if [ ! -x "$bin/lws-manager" ]; then
  say "building lws-manager $LWS_VERSION into $bin (cold: ~25 min on 2 cores; later runs reuse it)"
  t=$(date +%s)
  # The version stamp LWS's own Makefile sets (pkg/version), so `lws-manager --version` is honest.
  ldflags="-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION"
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-trimpath go build -ldflags "$ldflags" \
    -o "$bin/lws-manager.tmp" ./cmd)
  mv "$bin/lws-manager.tmp" "$bin/lws-manager"
  say "lws-manager built in $(( $(date +%s) - t ))s"
fi
echo "$bin"

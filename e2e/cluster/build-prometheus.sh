#!/usr/bin/env bash
# Builds Prometheus's own promtool (and the prometheus server) from the Go module proxy into the
# same cache as the control plane, keyed by version. The chart's alerts are unit-tested by
# `promtool test rules` and its rules and dashboard queries checked by `promtool check rules`
# (tests/install/test_chart_alerts.py, e2e/promtool.py); nothing here imitates PromQL.
#
#   e2e/cluster/build-prometheus.sh           build (or reuse) both, print the bin dir
#   e2e/cluster/build-prometheus.sh --where   print the bin dir if built, else say how; no build
#   PDWARDEN_CACHE=...                        cache root (default ~/.cache/pdwarden)
#
# Prometheus v3.X.Y is the Go module github.com/prometheus/prometheus at version v0.3XX.Y
# (3.16.0 is v0.316.0). Like build-lws.sh, the module is downloaded (`go mod download`, a no-op
# when cached) and built inside its own directory with its own go.mod and go.sum (GOWORK=off: the
# module ships a go.work naming directories its zip lacks), so every dependency version is
# Prometheus's. Without the builtinassets tag the server serves its API, not the web UI (whose
# compiled assets are not in the module). The stamp is written last, after `promtool --version`
# reported the pinned version, so a half-finished build is never taken for a finished one.
# Measured cold on 2 cores (modules downloaded, nothing compiled, load ~10 beside the control
# plane and LWS builds): promtool 482 s, then prometheus 122 s more (shared packages); warm, no
# time. The server scrapes a chart-installed operator and evaluates the chart's alerts in
# tests/install/test_install_cluster.py (e2e/prometheus.py).
set -euo pipefail

PROMETHEUS_VERSION=3.16.0
PROMETHEUS_MODULE_VERSION=v0.316.0

cache=${PDWARDEN_CACHE:-$HOME/.cache/pdwarden}
bin=$cache/prometheus-v$PROMETHEUS_VERSION/bin
stamp=$bin/.built
built() { [ -x "$bin/promtool" ] && [ -x "$bin/prometheus" ] && [ -e "$stamp" ]; }

if [ "${1:-}" = --where ]; then
  if built; then echo "$bin"; exit 0; fi
  echo "promtool $PROMETHEUS_VERSION is not built in $bin: run \`make prometheus-bin\`" >&2
  exit 1
fi

mkdir -p "$bin"
exec 9>"$cache/.build-prometheus.lock"  # one build at a time per cache (see build.sh)
flock 9
if built; then
  echo "$bin"
  exit 0
fi
say() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
dir=$(go mod download -json "github.com/prometheus/prometheus@$PROMETHEUS_MODULE_VERSION" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || {
  say "go mod download github.com/prometheus/prometheus@$PROMETHEUS_MODULE_VERSION gave no module directory"
  exit 1
}
# The version stamp Prometheus's own .promu.yml sets, so `promtool --version` is honest.
v=github.com/prometheus/common/version
ldflags="-s -w -X $v.Version=$PROMETHEUS_VERSION -X $v.Revision=$PROMETHEUS_MODULE_VERSION"
ldflags+=" -X $v.Branch=HEAD -X $v.BuildUser=pdwarden -X $v.BuildDate=$(date -u +%Y%m%d-%H:%M:%S)"
for b in promtool prometheus; do
  [ -x "$bin/$b" ] && continue
  say "building $b $PROMETHEUS_VERSION into $bin (cold: promtool ~8 min, prometheus 2 more on 2 cores; later runs reuse them)"
  t=$(date +%s)
  (cd "$dir" && GOWORK=off CGO_ENABLED=0 GOFLAGS=-trimpath go build -tags netgo \
    -ldflags "$ldflags" -o "$bin/$b.tmp" "./cmd/$b")
  mv "$bin/$b.tmp" "$bin/$b"
  say "$b built in $(( $(date +%s) - t ))s"
done
"$bin/promtool" --version 2>&1 | grep -q "version $PROMETHEUS_VERSION " || {
  say "$bin/promtool does not report version $PROMETHEUS_VERSION"
  exit 1
}
echo "prometheus $PROMETHEUS_VERSION (module $PROMETHEUS_MODULE_VERSION), $(go env GOVERSION)" >"$stamp"
echo "$bin"

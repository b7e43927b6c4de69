#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy into a cache
# outside the repository, keyed by version. Skips what is already built.
#
#   e2e/cluster/build.sh          build (or reuse) everything, print the bin dir
#   PDWARDEN_CACHE=...            cache root (default ~/.cache/pdwarden)
set -euo pipefail

K8S_VERSION=v1.35.4
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.21.4

here=$(cd "$(dirname "$0")" && pwd)
cache=${PDWARDEN_CACHE:-$HOME/.cache/pdwarden}
bin=$cache/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION/bin
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-trimpath
# One build at a time per cache: two `make test` (or a test session and a helper script) on one
# machine would otherwise compile the same binaries twice and race on their temporary files.
exec 9>"$cache/.build.lock"
flock 9

say() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
took() { printf '[build %s] %s built in %ss\n' "$(date +%H:%M:%S)" "$1" "$(( $(date +%s) - $2 ))" >&2; }

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
# helm's default Kubernetes version (what `helm template` assumes without --kube-version; helm
# compiles in v1.20 unless told) is stamped at link time like the other binaries' versions. The
# marker names the stamp this helm carries, so a helm built without it, or for another
# K8S_VERSION, is rebuilt alone (a relink from Go's build cache) and a fresh machine builds it
# stamped.
helm_marker=$bin/.helm-kube-$K8S_VERSION
helm_ok() { [ -x "$bin/helm" ] && [ -e "$helm_marker" ]; }

need=()
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; do
  [ -x "$bin/$b" ] || need+=("$b")
done
helm_ok || need+=(helm)
if [ ${#need[@]} -eq 0 ]; then
  echo "$bin"
  exit 0
fi
say "building ${need[*]} into $bin"
if [ "${need[*]}" != helm ]; then
  say "a cold build downloads ~1 GB of Go modules and compiles for 10-40 minutes on 2 cores (kube-apiserver, the first, is the slowest); later runs reuse the cache"
fi

build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
k8s_ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  k8s_ldflags+=" -X $p.gitTreeState=clean -X $p.gitCommit=pdwarden-local -X $p.buildDate=$build_date"
done

for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  [ -x "$bin/$b" ] && continue
  say "building $b $K8S_VERSION"
  t=$(date +%s)
  (cd "$here/k8s" && go build -ldflags "$k8s_ldflags" -o "$bin/$b.tmp" "k8s.io/kubernetes/cmd/$b")
  mv "$bin/$b.tmp" "$bin/$b"; took "$b" "$t"
done

if [ ! -x "$bin/etcd" ]; then
  say "building etcd $ETCD_VERSION"; t=$(date +%s)
  (cd "$here/etcd" && go build -ldflags "-s -w" -o "$bin/etcd.tmp" .)
  mv "$bin/etcd.tmp" "$bin/etcd"; took etcd "$t"
fi

gobin_install() {  # name, package@version, ldflags[, force]
  local name=$1 pkg=$2 ldflags=$3 force=${4:-} t
  [ -x "$bin/$name" ] && [ -z "$force" ] && return 0
  say "building $name ${pkg##*@}"; t=$(date +%s)
  local tmp; tmp=$(mktemp -d)
  GOBIN=$tmp go install -ldflags "$ldflags" "$pkg"
  mv "$tmp/$name" "$bin/$name"; rmdir "$tmp"; took "$name" "$t"
}
gobin_install kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "-s -w"
if ! helm_ok; then
  helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    helm_ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
  done
  # Installed to a temporary GOBIN and moved over the old one: a running test never sees no helm.
  gobin_install helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "$helm_ldflags" force
  touch "$helm_marker"
fi

echo "$bin"

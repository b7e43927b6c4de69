#!/usr/bin/env bash
# Run pdwarden's e2e suite on kind, with real container images, where Docker and kind exist.
# NOT run in CI here (no Docker engine); the local control plane (make cluster-up) is used there.
#
#   e2e/kind/run.sh            create cluster, build + load images, helm install, run the suite
#   KEEP=1 e2e/kind/run.sh     leave the cluster running afterwards
#   e2e/kind/run.sh down       delete the cluster
#
# Needs: docker, kind (>= 0.23), helm, kubectl, and the repository's .venv (make venv).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
name="${KIND_CLUSTER:-pdwarden}"
tag="${TAG:-kind}"
kubeconfig="$root/.cluster/kind-kubeconfig"

if [[ "${1:-}" == "down" ]]; then
  kind delete cluster --name "$name"
  exit 0
fi
for tool in docker kind helm kubectl; do
  command -v "$tool" >/dev/null || { echo "e2e/kind: $tool not found" >&2; exit 2; }
done

mkdir -p "$root/.cluster"
if ! kind get clusters | grep -qx "$name"; then
  kind create cluster --name "$name" --config "$root/e2e/kind/kind-config.yaml" \
    --kubeconfig "$kubeconfig" --wait 120s
fi
export KUBECONFIG="$kubeconfig"

# Images: the operator, and the CPU worker (the examples use gpus: 0 on kind).
docker build -f "$root/images/operator.Dockerfile" -t "ghcr.io/pdwarden/pdwarden:$tag" "$root"
docker build -f "$root/images/worker-cpu.Dockerfile" -t "ghcr.io/pdwarden/pdworker:$tag" "$root"
kind load docker-image --name "$name" "ghcr.io/pdwarden/pdwarden:$tag" "ghcr.io/pdwarden/pdworker:$tag"

# The examples name pdwarden/pdworker:dev: give the CPU worker that name too.
docker tag "ghcr.io/pdwarden/pdworker:$tag" pdwarden/pdworker:dev
kind load docker-image --name "$name" pdwarden/pdworker:dev

# The chart watches one smoke namespace only: the suite starts its own operators per test
# namespace, and a cluster-wide one would fight them.
kubectl create namespace pdwarden-smoke --dry-run=client -o yaml | kubectl apply -f -
helm upgrade --install pdwarden "$root/helm/pdwarden" -n pdwarden-system --create-namespace \
  --set image.tag="$tag" --set image.pullPolicy=Never --set "watchNamespaces={pdwarden-smoke}" \
  --wait --timeout 180s
kubectl apply -n pdwarden-smoke -f "$root/manifests/examples/minimal-cpu.yaml"
kubectl wait -n pdwarden-smoke pdd/minimal --for=jsonpath='{.status.phase}'=Ready --timeout=300s

# The same suite, against this cluster (e2e/fixtures.py takes any kubeconfig).
status=0
PDWARDEN_E2E_KUBECONFIG="$kubeconfig" "$root/.venv/bin/python" -m pytest -m cluster "$@" || status=$?

if [[ -z "${KEEP:-}" ]]; then
  kind delete cluster --name "$name"
fi
exit "$status"

"""A local kubelet that runs the pods of a real control plane as processes on this machine.

Why: there is no container runtime here, yet the operator must be tested against real scheduling,
StatefulSets, readiness gates, EndpointSlices and RBAC. This package registers fake GPU/CPU nodes
with a real kube-apiserver and runs every pod bound to them as local process groups, reporting real
pod status. See `python -m e2e.kubelet --help` and README-KUBELET.md in this directory.
"""

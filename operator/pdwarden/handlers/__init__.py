"""The kopf handler bodies, one module per kind; `main` registers them.

Why a package: a handler only wraps a shell from `reconciling` or `remediation` in a cycle
(errors, interval, forget), so both kinds share that wrapper here and no pipeline knows kopf."""

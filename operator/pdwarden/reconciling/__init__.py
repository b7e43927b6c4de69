"""The reconcile pipeline: watch -> render -> apply -> observe, for each PDDeployment.

Why a package: `plan` and `observe` are pure (what to apply, what status to report); only
`reconcile` talks to the API server."""

"""PDRemediationPolicy only: which pods a policy may touch (`scope`) and whether its cordon can
work (`cordon`). All pure."""

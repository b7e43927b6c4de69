"""The kinds of object the one remediation cycle runs for: PDDeployment and PDRemediationPolicy."""

"""The remediation pipeline: scrape -> detect -> (confirm) -> plan -> act -> record, each stage a
subpackage.

Why: the code that runs during an incident reads in the order it happens; `cycle` (PDDeployment)
and `policy_cycle` (PDRemediationPolicy) are the shells that fetch, call the stages and write."""

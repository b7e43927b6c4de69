"""The remediation pipeline: scrape -> detect -> (confirm) -> decide -> act -> record, each stage
a subpackage.

Why: the code that runs during an incident reads in the order it happens; `cycle` is the one
shell that fetches, calls the stages and writes, for both kinds of object, through the kind
adapters in `kinds` (PDDeployment, PDRemediationPolicy)."""

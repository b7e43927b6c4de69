"""Stage 2b, confirm: between detect and plan, ask a suspect pod itself before a suspicion is
acted on (`canary`: one token from a vLLM decode). The only I/O of this stage; what a verdict
means for the plan is pure (`decide.verdicts`)."""

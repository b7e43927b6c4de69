"""Stage 3, plan: findings into actions within budget and breaker (`plan`), which pods
a PDRemediationPolicy may touch (`scope`), whether its cordon can work (`cordon`), and which
decodes a canary asks and what its verdicts mean (`canary`). All pure."""

"""Stage 3, plan: findings into actions within budget and breaker (`plan`), which pods
a PDRemediationPolicy may touch (`scope`) and whether its cordon can work (`cordon`). All pure."""

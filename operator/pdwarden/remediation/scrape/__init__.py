"""Stage 1, scrape: worker pods' /metrics (and room lists) into samples.

Why: only `worker_client` does HTTP; parsing (`samples`, with each engine's metric table from
`pdwarden.engines`) and bounding (`sanitize`) are pure."""

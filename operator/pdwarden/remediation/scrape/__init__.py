"""Stage 1, scrape: worker pods' /metrics (and room lists) into samples.

Why: only `client` does HTTP; parsing (`samples`, `engines`) and bounding (`sanitize`) are pure."""

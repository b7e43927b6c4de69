"""Stage 6, record: the ledger and conditions each cycle leaves in status, and the one
resourceVersion-guarded status store both kinds write through. Only `store` does I/O."""

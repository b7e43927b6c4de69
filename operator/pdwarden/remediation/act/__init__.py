"""Stage 4, act: how actions land on pods: SGLang's admin API (`sglang`), label cordon
and eviction of pods pdwarden does not own (`foreign`, pure: patches and outcomes)."""

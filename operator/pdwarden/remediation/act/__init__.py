"""Stage 5, act: how planned actions land on pods, one module per target: pdworker's admin API
(`worker_admin`), SGLang's abort API (`sglang_abort`, with what an abort costs: `abort_cost`),
the serving pod condition (`pod_condition`), a policy's label cordon (`pod_label`) and pod
deletion or eviction (`restart`); `done` is the outcome they all return."""

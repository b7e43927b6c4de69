"""What a stock SGLang prefill pod's launch flags say about its inflight queue.

Why: detection may excuse a prefill inflight queue that does not drain while a decode pod is busy
with a backlog of requests waiting for KV slots (`detect.rules.inflight_not_draining`). SGLang
0.5.23 can produce that situation only under some prefill settings, and the excuse hides real
wedges under load everywhere else (issue 25). With the defaults a room leaves the bootstrap queue
only once its decode has allocated KV and sent the destination (disaggregation/prefill.py:1-17,
`pop_bootstrapped` at :497), so a decode short of slots keeps rooms in the *bootstrap* queue, never
in the inflight one. A room computed before its decode allocated is "parked" in the inflight
queue until its decode allocates (prefill.py:1192-1218, `pending_bootstrap`) only when
`can_prefill_before_bootstrap` (prefill.py:484-494) holds: `--optimistic-prefill-attempts` > 0
(srt/arg_groups/fields/disagg.py:125-127, default 0) or
`--disaggregation-decode-allocation-policy prefill_complete` (disagg.py:59-64, default early;
it turns optimistic prefill on by itself, arg_groups/pd_disaggregation_hook.py:47-55).
SGLang turns optimistic prefill off again with `--pp-size` > 1 (arg_groups/serving_hook.py:
503-512; prefill_complete then refuses to start, :533-541).

The flags are read from the pod, the one source that is true for pods pdwarden renders and pods
another system runs: the container whose command line runs `sglang.launch_server` (or `sglang
serve`), shell one-liners included. Read as SGLang's argparse reads them (server_args.py:679, an
`ArgumentParser` with `allow_abbrev` on): the last occurrence wins, `--flag value` and
`--flag=value`, and any prefix of a flag that names no other flag. When the answer cannot be
known (no SGLang command line, a `--config` file that may set anything, a value that does not
parse) the excuse stays: it can only delay a finding, never cause one. The configuration advisor
(`sglang_advice`) reads the same command line through `server` and `last_value`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from pdwarden.engines import pod_command

# Flag -> the shortest prefix of it that names no other 0.5.23 flag (argparse accepts any prefix
# from there on). Checked against the wheel's srt/arg_groups/fields/ by a test.
# A flag's aliases share one destination: the last occurrence of any of them wins.
Flag = tuple[tuple[str, str], ...]
OPTIMISTIC: Final[Flag] = (("--optimistic-prefill-attempts", "--op"),)
ALLOCATION: Final[Flag] = (
    ("--disaggregation-decode-allocation-policy", "--disaggregation-decode-a"),
)
PP_SIZE: Final[Flag] = (("--pp-size", "--pp-s"), ("--pipeline-parallel-size", "--pi"))
# Read by the configuration advisor (sglang_advice).
MODE: Final[Flag] = (("--disaggregation-mode", "--disaggregation-m"),)
WATCHDOG: Final[Flag] = (("--watchdog-timeout", "--watc"),)
CONFIG: Final = "--config"  # server_args.py:683-689: merges a YAML file of flags
# Where a prefill's bootstrap server listens (the pair canary's KV request names it).
BOOTSTRAP_PORT: Final[Flag] = (("--disaggregation-bootstrap-port", "--disaggregation-b"),)
DEFAULT_BOOTSTRAP_PORT: Final = 8998  # srt/arg_groups/fields/disagg.py


def launch_tokens(pod: Mapping[str, Any]) -> list[str] | None:
    """The command line of the pod's SGLang server, split like a shell would; None if no
    container runs one."""
    command = server(pod)
    return None if command is None else list(command.tokens)


def server(pod: Mapping[str, Any]) -> pod_command.ServerCommand | None:
    """The pod's SGLang server container: its command line and its literal environment."""
    return pod_command.server_command(pod, is_sglang_entry)


def is_sglang_entry(token: str, following: Sequence[str]) -> bool:
    return token.endswith("sglang.launch_server") or (
        token.rsplit("/", maxsplit=1)[-1] == "sglang" and list(following) == ["serve"]
    )


def last_value(tokens: Sequence[str], flag: Flag) -> str | None:
    """The value of the flag's last occurrence under any of its names (argparse keeps the
    last), or None."""
    value = None
    for i, token in enumerate(tokens):
        name, eq, inline = token.partition("=")
        if not any(name.startswith(short) and full.startswith(name) for full, short in flag):
            continue
        if eq:
            value = inline
        elif i + 1 < len(tokens):
            value = tokens[i + 1]
    return value


def rooms_wait_for_decode_kv(pod: Mapping[str, Any]) -> bool:
    """True if rooms may sit in this SGLang prefill's inflight queue waiting for a decode to
    allocate KV (so a decode backlog can excuse a queue that does not drain); also when the
    settings cannot be known."""
    tokens = launch_tokens(pod)
    if tokens is None or any(t.partition("=")[0] == CONFIG for t in tokens):
        return True
    try:
        attempts = int(last_value(tokens, OPTIMISTIC) or "0")
        pp = int(last_value(tokens, PP_SIZE) or "1")
    except ValueError:
        return True  # SGLang would refuse to start; nothing to judge anyway
    policy = last_value(tokens, ALLOCATION) or "early"
    if policy != "early":
        return True  # prefill_complete (or a value this table does not know)
    return attempts > 0 and pp <= 1


def bootstrap_port(pod: Mapping[str, Any]) -> int:
    """The port of this SGLang prefill's bootstrap server, from its command line (SGLang's
    default when the flag is absent); 0 when it cannot be known (no SGLang command line, a
    `--config` file, a value that is no port)."""
    tokens = launch_tokens(pod)
    if tokens is None or any(t.partition("=")[0] == CONFIG for t in tokens):
        return 0
    value = last_value(tokens, BOOTSTRAP_PORT)
    if value is None:
        return DEFAULT_BOOTSTRAP_PORT
    port = int(value) if value.isdigit() else 0
    return port if 0 < port < 65536 else 0

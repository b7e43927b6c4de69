"""Settings of a stock SGLang (0.5.23) pod that switch SGLang's own safety nets off.

Why: pdwarden repairs what SGLang does not; SGLang's own deadlines (the PD bootstrap and waiting
timeouts, the decode's heartbeat to its prefills, the scheduler watchdog, the generating /health)
and its deferred KV release on a decode are what bound a wedge or keep one request from decoding
another's KV before pdwarden ever looks. A pod that turns one of them off (often copied from a
benchmark or a debugging session: SGLang's own warning suggests raising a timeout) gets a warning,
never a block and never a different action. Each rule cites the 0.5.23 wheel's source.

What is read, and how (`sglang_flags.server`): the container that runs the SGLang server, its
flags as SGLang's argparse reads them (the last occurrence wins, any unambiguous prefix; a
`--config` file may set anything, so flags are not judged then) and its environment as SGLang's
`envs` reads it (srt/environ.py:45-210: an int or float that does not parse falls back to the
default, a bool is one of true/1/yes/y or false/0/no/n in any case). The role is the pod's own
`--disaggregation-mode` (prefill or decode; null, the default, is no PD server): a rule that acts
on one role only fires there. A pod with no SGLang command line, or a value it does not state
literally, gets no advice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from pdwarden.engines import sglang_flags as flags
from pdwarden.engines.pod_command import ServerCommand
from pdwarden.engines.protocol import Advice, AdviceRule, Obj

HUGE_SECONDS: Final = 3600.0  # a deadline over an hour is, for a request, no deadline at all
DEFAULT_WAITING: Final = 300  # srt/environ.py:763, also what the heartbeat is measured against
SHORT_RELEASE_SECONDS: Final = 5.0
# Backends whose decode holds aborted KV until the prefill's writes drain (base/conn.py:164
# defaults to False; mooncake/conn.py:260, nixl/conn.py:519, mori/conn.py:377 set it).
DEFERRING_BACKENDS: Final = frozenset({"mooncake", "mooncake_tcp", "nixl", "mori"})
TRANSFER: Final[flags.Flag] = (("--disaggregation-transfer-backend", "--disaggregation-t"),)

BOOTSTRAP_TIMEOUT: Final = AdviceRule(
    "SGLangBootstrapTimeoutHuge",
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
    "srt/disaggregation/common/conn.py:2385-2407 (default 300 s: srt/environ.py:759)",
    "A prefill room whose decode never sends its KV destination keeps its KV cache and metadata "
    "slot for this long instead of 300 s, and leaked metadata slots stall every admission.",
)
WAITING_TIMEOUT: Final = AdviceRule(
    "SGLangWaitingTimeoutHuge",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
    "srt/disaggregation/common/conn.py:2888-2903 (default 300 s: srt/environ.py:763)",
    "A decode whose KV never arrives (a frozen or replaced prefill; NIXL pushes no failure to "
    "the decode) holds the request and its preallocated KV for this long instead of 300 s.",
)
HEARTBEAT: Final = AdviceRule(
    "SGLangHeartbeatTooSlow",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL x SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE",
    "srt/disaggregation/common/conn.py:477-485, :2004-2046 (defaults 5 s x 2: "
    "srt/environ.py:761-762)",
    "The decode notices a dead prefill only after this long, no sooner than SGLang's 300 s "
    "waiting timeout would fail its rooms anyway, so the heartbeat never fails them first.",
)
WATCHDOG: Final = AdviceRule(
    "SGLangWatchdogTimeoutHuge",
    "--watchdog-timeout",
    "srt/utils/watchdog.py:133-163 (default 300 s: srt/arg_groups/fields/device.py:66-69)",
    "A forward batch that hangs (a stuck collective or kernel) no longer crashes the server "
    "within 300 s, so the pod stays up and Ready while serving nothing.",
)
HEALTH_GENERATION: Final = AdviceRule(
    "SGLangHealthGenerationOff",
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION",
    "srt/entrypoints/http_server.py:745-749 (default true: srt/environ.py:344)",
    "/health answers 200 without running a generation, so a liveness probe on /health (the one "
    "pdwarden renders) never restarts a hung scheduler.",
)
HEALTH_BYPASS: Final = AdviceRule(
    "SGLangHealthBypassed",
    "SGLANG_DIAG_BYPASS_HEALTH_GENERATE",
    "srt/entrypoints/http_server.py:738-743 (default false: srt/environ.py:346)",
    "/health and /health_generate answer 200 without running anything, so no probe or router "
    "health check can see a hung scheduler.",
)
DEFERRED_RELEASE: Final = AdviceRule(
    "SGLangDeferredKVReleaseOff",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE",
    "srt/disaggregation/decode.py:2894-2912, srt/disaggregation/common/conn.py:338-341 "
    "(default true: srt/environ.py:777)",
    "A decode frees an aborted or failed transfer's KV pages at once while the prefill's writes "
    "may still land in them, so a later request can decode from another request's KV without "
    "any error.",
)
RELEASE_TIMEOUT: Final = AdviceRule(
    "SGLangDeferredKVReleaseTimeoutShort",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT",
    "srt/disaggregation/decode.py:3046-3100 (default 30 s: srt/environ.py:778)",
    "Under 5 s a decode releases an aborted transfer's KV pages before a slow or queued prefill "
    "write has drained ('releasing anyway'), so a later request can read another's KV.",
)
RULES: Final = (
    BOOTSTRAP_TIMEOUT, WAITING_TIMEOUT, HEARTBEAT, WATCHDOG, HEALTH_GENERATION, HEALTH_BYPASS,
    DEFERRED_RELEASE, RELEASE_TIMEOUT,
)  # fmt: skip


def _number(env: Mapping[str, str], name: str, parse: type[int] | type[float]) -> float | None:
    """The variable as SGLang's EnvInt/EnvFloat reads it; None when unset or unparsable (SGLang
    then uses its default)."""
    raw = env.get(name)
    try:
        return None if raw is None else float(parse(raw))
    except ValueError:
        return None


def _bool(env: Mapping[str, str], name: str) -> bool | None:
    """The variable as SGLang's EnvBool reads it; None when unset or not a bool."""
    raw = (env.get(name) or "").lower()
    if raw in ("true", "1", "yes", "y"):
        return True
    return False if raw in ("false", "0", "no", "n") else None


def _huge(seconds: float | None) -> bool:
    return seconds is not None and (math.isnan(seconds) or seconds > HUGE_SECONDS)


def _flag_rules(cmd: ServerCommand) -> list[Advice]:
    raw = flags.last_value(cmd.args, flags.WATCHDOG)
    try:
        watchdog = None if raw is None else float(raw)
    except ValueError:
        watchdog = None  # argparse refuses it: SGLang does not start
    return [WATCHDOG.advise(raw)] if _huge(watchdog) else []


def _pd_rules(cmd: ServerCommand, mode: str) -> list[Advice]:
    env, out = cmd.env, []
    policy = flags.last_value(cmd.args, flags.ALLOCATION)
    if mode == "prefill" and _huge(_number(env, BOOTSTRAP_TIMEOUT.setting, int)):
        out.append(BOOTSTRAP_TIMEOUT.advise(env[BOOTSTRAP_TIMEOUT.setting]))
    # A prefill reads the waiting timeout only under prefill_complete (common/conn.py:417-430).
    if (mode == "decode" or policy == "prefill_complete") and _huge(
        _number(env, WAITING_TIMEOUT.setting, int)
    ):
        out.append(WAITING_TIMEOUT.advise(env[WAITING_TIMEOUT.setting]))
    if mode != "decode":
        return out
    interval = _number(env, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", float)
    failures = _number(env, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", int)
    if interval is not None or failures is not None:
        # Floored at 2 s and 1 failure (common/conn.py:477-485); NaN never compares below.
        i, f = interval if interval is not None else 5.0, failures if failures is not None else 2
        detect = math.inf if math.isnan(i) else max(i, 2.0) * max(f, 1.0)
        if detect >= DEFAULT_WAITING:
            out.append(HEARTBEAT.advise(f"{i:g} s x {f:g} = {detect:g} s"))
    backend = flags.last_value(cmd.args, TRANSFER) or "mooncake"
    if backend not in DEFERRING_BACKENDS:
        return out
    deferred = _bool(env, DEFERRED_RELEASE.setting)
    if deferred is False:
        out.append(DEFERRED_RELEASE.advise(env[DEFERRED_RELEASE.setting]))
    release = _number(env, RELEASE_TIMEOUT.setting, float)
    if deferred is not False and release is not None and release < SHORT_RELEASE_SECONDS:
        out.append(RELEASE_TIMEOUT.advise(env[RELEASE_TIMEOUT.setting]))
    return out


def advisories(pod: Obj) -> tuple[Advice, ...]:
    """Every rule of `RULES` that fires on this pod (module docstring)."""
    cmd = flags.server(pod)
    if cmd is None:
        return ()
    configured = any(t.partition("=")[0] == flags.CONFIG for t in cmd.args)
    out = [] if configured else _flag_rules(cmd)
    if _bool(cmd.env, HEALTH_GENERATION.setting) is False:
        out.append(HEALTH_GENERATION.advise(cmd.env[HEALTH_GENERATION.setting]))
    if _bool(cmd.env, HEALTH_BYPASS.setting) is True:
        out.append(HEALTH_BYPASS.advise(cmd.env[HEALTH_BYPASS.setting]))
    mode = None if configured else flags.last_value(cmd.args, flags.MODE)
    if mode in ("prefill", "decode"):  # the role-specific rules need the role
        out += _pd_rules(cmd, mode)
    return tuple(out)

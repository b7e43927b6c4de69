"""An engine server's command line and environment, read from the pod object, bounded.

Why a module: what a stock engine pod runs is said only by the pod itself (pdwarden renders some
of them, other systems the rest), and two readers need it: the SGLang launch-flag reader
(`sglang_flags`) and the configuration advisor (`sglang_advice`, `vllm_advice`). Both must
read it the same way: the one container whose command line runs the server (shell one-liners
included, `sh -c "... python3 -m sglang.launch_server ..."`, whose script is split as the shell
splits it), and that
container's environment as the kubelet sets it (a later entry of the same name wins), overlaid by
`NAME=value` assignments the command line makes before the server starts (`env`, `export`, a
shell prefix). Everything is capped: tokens, environment entries and the length of a value; a
value the pod does not state literally (`valueFrom`, `envFrom`, `$(VAR)` or `$VAR`) is not read
at all, so no advice ever rests on a guess.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

MAX_TOKENS: Final = 4096  # of one container's command line, after shell splitting
MAX_ENV: Final = 1024  # environment entries read from one container
MAX_VALUE: Final = 16384  # characters of one value (a JSON flag, an environment variable)
_ASSIGNMENT: Final = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
SHELLS: Final = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})
_SCRIPT_OPTION: Final = re.compile(r"^-[A-Za-z]*c[A-Za-z]*$")  # -c, -lc, -ec, -xc

# (token, the tokens after it) -> whether the token starts the engine's server.
IsEntry = Callable[[str, Sequence[str]], bool]


@dataclass(frozen=True)
class ServerCommand:
    """The server container's command line (its tokens) and its literal environment."""

    tokens: tuple[str, ...]
    entry: int  # the index of the token that starts the server
    env: Mapping[str, str]
    # Every variable the container or the command line sets, literally or not (`valueFrom` a
    # Secret, `$(VAR)`): whether a setting is on, where its value must not be read or shown.
    named: frozenset[str] = frozenset()

    @property
    def args(self) -> tuple[str, ...]:
        """The tokens after the server's entry point: its own flags."""
        return self.tokens[self.entry + 1 :]


def split(container: Mapping[str, Any]) -> list[str]:
    """A container's command and args, a shell's script (`sh -c "python3 -m ..."`) split as
    the shell splits it, capped. Any other item is one argument, spaces and all (a JSON flag
    value `{"kv_role": "kv_producer"}` is one argument in a list that no shell reads)."""
    raw = [item for key in ("command", "args") for item in _items(container.get(key))]
    tokens: list[str] = []
    shell = False
    for item in raw[:MAX_TOKENS]:
        if not isinstance(item, str):
            continue
        if shell and tokens and _SCRIPT_OPTION.match(tokens[-1]):
            try:
                tokens += shlex.split(item)
            except ValueError:
                tokens.append(item)
        else:
            tokens.append(item)
        shell = shell or item.rsplit("/", maxsplit=1)[-1] in SHELLS
    return tokens[:MAX_TOKENS]


def _items(value: object) -> list[object]:
    return value[:MAX_TOKENS] if isinstance(value, list) else []


def _literal(value: object) -> str | None:
    if not isinstance(value, str) or len(value) > MAX_VALUE or "$" in value:
        return None  # $(VAR) is expanded by the kubelet, $VAR by a shell: not what it says
    return value


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The environment variables a container states literally (later entries win)."""
    env: dict[str, str] = {}
    entries = container.get("env") or []
    for entry in entries[:MAX_ENV] if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        value = None if "valueFrom" in entry else _literal(entry.get("value", ""))
        if value is None:
            env.pop(entry["name"], None)  # set, but not to anything this reader can know
        else:
            env[entry["name"]] = value
    return env


def _env_names(container: Mapping[str, Any]) -> list[str]:
    entries = container.get("env") or []
    return [
        e["name"]
        for e in (entries[:MAX_ENV] if isinstance(entries, list) else [])
        if isinstance(e, Mapping) and isinstance(e.get("name"), str)
        and ("valueFrom" in e or e.get("value"))
    ]  # fmt: skip


def server_command(pod: Mapping[str, Any], is_entry: IsEntry) -> ServerCommand | None:
    """The first container whose command line starts the server; None if none does."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    for c in containers if isinstance(containers, list) else []:
        if not isinstance(c, Mapping):
            continue
        tokens = split(c)
        entry = next((i for i, t in enumerate(tokens) if is_entry(t, tokens[i + 1 : i + 2])), None)
        if entry is None:
            continue
        env = container_env(c)
        named = set(_env_names(c))
        for token in tokens[:entry]:  # `env X=1 python3 -m ...`, `export X=1; python3 ...`
            if (m := _ASSIGNMENT.match(token)) is not None:
                named.add(m.group(1))
                value = _literal(m.group(2).rstrip(";"))
                if value is None:
                    env.pop(m.group(1), None)
                else:
                    env[m.group(1)] = value
        return ServerCommand(tuple(tokens), entry, env, frozenset(named))
    return None

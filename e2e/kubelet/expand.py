"""Kubernetes `$(VAR)` expansion and container-path substitution, as pure functions.

Why: processes are not in a mount namespace, so a volume mounted at `/etc/config` really lives in
the pod's directory under the state dir. We rewrite every occurrence of a mountPath (as a path
prefix) in command, args, env values, workingDir and exec probes to the host directory. That covers
the common cases (`--config /etc/config/x.yaml`, `CONFIG=/etc/config`); a program that hard-codes a
container path in its own source will not see the volume.
"""

from __future__ import annotations

import re
from collections.abc import Mapping


def expand(text: str, env: Mapping[str, str]) -> str:
    """`$(NAME)` -> env[NAME] if defined, else left as is; `$$` -> `$` (k8s expansion rules)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def substitute_paths(text: str, mounts: Mapping[str, str]) -> str:
    """Replace each container mountPath used as a path prefix by its host directory.

    One pass over the text with the longest mount path winning, so a replacement (a host path,
    which may itself start with a mount path such as /tmp) is never rewritten again.
    """
    prefixes = sorted((p.rstrip("/") for p in mounts if p.rstrip("/")), key=len, reverse=True)
    if not prefixes:
        return text
    hosts = {p.rstrip("/"): h for p, h in mounts.items() if p.rstrip("/")}
    # A mount path counts when it is a whole path component: not preceded by a path character
    # and followed by '/', end, or a non-path character.
    pattern = re.compile(
        r"(?<![\w./-])(" + "|".join(re.escape(p) for p in prefixes) + r")(?=/|$|[^\w.-])"
    )
    return pattern.sub(lambda m: hosts[m.group(1)], text)

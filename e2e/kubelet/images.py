"""Which local program stands in for which container image.

Why: there is no container runtime, so an image name only decides how the container's command is
resolved on this machine. The table (first match wins, on the last path component of the image's
repository, ignoring registry, tag and digest):

=================  ==========  ===============  ===================================================
repository ends    runner      entrypoint       how argv[0] is resolved
=================  ==========  ===============  ===================================================
pdwarden           venv        ``pdwarden``     the venv's bin dir (of sys.executable), then PATH
pdworker           venv        ``pdworker``     same
python             venv        ``python``       same; ``python``/``python3``/``python3.X`` is the
                                                venv interpreter itself
kubectl            kubectl     ``kubectl``      ``kubectl`` is the pinned kubectl (``--kubectl``)
sglang-sim         sglang-sim  ``python3``      ``python3 -m sglang.launch_server ARGS`` runs the
                                                SIMULATED SGLang server e2e/sglang_sim.py with the
                                                same ARGS (bodies of servers too big for this box)
sglang             sglang      ``python3``      REAL SGLang: ``python``/``python3`` are the stock
                                                SGLang CPU venv's (e2e/sglang,
                                                ``make sglang-venv``), which holds the server and
                                                ``sglang_router`` both
vllm-openai        vllm        ``vllm serve``   REAL vLLM: ``vllm``, ``python``/``python3`` are the
                                                ones of the stock vLLM CPU venv (e2e/vllm,
                                                ``make vllm-venv``); the image's own entrypoint is
                                                ``vllm serve``
busybox, alpine,   host        ``sh``           the host PATH (for ``sh -c`` glue and tests)
debian, ubuntu
=================  ==========  ===============  ===================================================

Any other image fails its container with reason ``ImageNotMapped`` (like ``ErrImagePull``).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass

VENV_BIN = os.path.dirname(sys.executable)

# repository suffix -> (runner, default entrypoint)
IMAGE_TABLE: dict[str, tuple[str, str]] = {
    "pdwarden": ("venv", "pdwarden"),
    "pdworker": ("venv", "pdworker"),
    "python": ("venv", "python"),
    "kubectl": ("kubectl", "kubectl"),
    "sglang-sim": ("sglang-sim", "python3"),
    "sglang": ("sglang", "python3"),
    "vllm-openai": ("vllm", "vllm serve"),
    "busybox": ("host", "sh"),
    "alpine": ("host", "sh"),
    "debian": ("host", "sh"),
    "ubuntu": ("host", "sh"),
}

_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
E2E_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SGLANG_SIM = os.path.join(E2E_DIR, "sglang_sim.py")
SGLANG_SERVER_MODULE = "sglang.launch_server"


class ImageNotMapped(Exception):
    """The image has no local stand-in; the message says what would."""


@dataclass(frozen=True)
class Runner:
    kind: str
    entrypoint: str


def repository_name(image: str) -> str:
    """`ghcr.io/acme/pdworker:1.2@sha256:..` -> `pdworker`."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def runner_for(image: str) -> Runner:
    repo = repository_name(image)
    for suffix, (kind, entry) in IMAGE_TABLE.items():
        if repo == suffix or repo.endswith(("-" + suffix, "_" + suffix)):
            return Runner(kind, entry)
    known = ", ".join(sorted(IMAGE_TABLE))
    raise ImageNotMapped(
        f"image {image!r} has no local stand-in; the local kubelet runs images whose repository "
        f"ends with one of: {known} (see e2e/kubelet/images.py)"
    )


def resolve_argv(
    image: str, command: list[str], args: list[str], kubectl: str | None, path: str
) -> list[str]:
    """Kubernetes semantics: `command` replaces the entrypoint, `args` the image's arguments."""
    runner = runner_for(image)
    argv = list(command) if command else runner.entrypoint.split()
    argv += list(args)
    exe = argv[0]
    if runner.kind == "sglang-sim":
        return _sglang_sim_argv(image, argv)
    if runner.kind == "vllm":
        return _vllm_argv(image, argv)
    if runner.kind == "sglang":
        return _sglang_argv(image, argv)
    if "/" in exe:
        return argv
    if runner.kind == "venv" and _PYTHON.match(exe):
        found: str | None = sys.executable
    elif runner.kind == "kubectl" and exe == "kubectl":
        found = kubectl or shutil.which("kubectl", path=path)
    elif runner.kind == "venv":
        cand = os.path.join(VENV_BIN, exe)
        found = cand if os.access(cand, os.X_OK) else shutil.which(exe, path=path)
    else:
        found = shutil.which(exe, path=path)
    if not found:
        raise FileNotFoundError(f"{exe!r} not found for image {image!r} (runner {runner.kind})")
    return [found, *argv[1:]]


def _sglang_sim_argv(image: str, argv: list[str]) -> list[str]:
    """`python3 -m sglang.launch_server ARGS` -> the simulator with the same ARGS."""
    if (
        len(argv) >= 3
        and _PYTHON.match(os.path.basename(argv[0]))
        and argv[1:3]
        == [
            "-m",
            SGLANG_SERVER_MODULE,
        ]
    ):
        return [sys.executable, SGLANG_SIM, *argv[3:]]
    raise FileNotFoundError(
        f"image {image!r}: only `python3 -m {SGLANG_SERVER_MODULE}` is simulated locally "
        f"(e2e/sglang_sim.py), not {' '.join(argv[:3])!r}"
    )


def _vllm_argv(image: str, argv: list[str]) -> list[str]:
    """`vllm ...` and `python3 ...` run from the stock vLLM venv; anything else from the host."""
    from e2e.vllm import venv_dir, venv_ready

    venv = venv_dir()
    if not venv_ready(venv):
        raise FileNotFoundError(
            f"image {image!r} runs stock vLLM from {venv}, which is not built: run `make vllm-venv`"
        )
    exe = argv[0]
    if exe == "vllm":
        return [str(venv / "bin" / "vllm"), *argv[1:]]
    if _PYTHON.match(exe):
        return [str(venv / "bin" / "python"), *argv[1:]]
    return argv


def _sglang_argv(image: str, argv: list[str]) -> list[str]:
    """`python3 ...` runs from the stock SGLang venv; anything else from the host."""
    from e2e.sglang import venv_dir, venv_ready

    venv = venv_dir()
    if not venv_ready(venv):
        raise FileNotFoundError(
            f"image {image!r} runs stock SGLang from {venv}, which is not built: "
            "run `make sglang-venv`"
        )
    if _PYTHON.match(argv[0]):
        return [str(venv / "bin" / "python"), *argv[1:]]
    return argv

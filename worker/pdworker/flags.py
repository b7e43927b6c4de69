"""The command-line flags as data: one row per flag, from which argparse and the configs are built.

Why a table: each flag used to be written down three times (an `add_argument` call, a line that
copied it into a config, and the config field's default), in a 170-line function nobody could
check by eye. Here a `Flag` row says, once, which commands take it, its type and default, its
help text, its argument group and the config field it sets (`field`, dotted for nested configs:
`model.layers`), or None for the few that steer the process itself (log level, torch threads,
NIXL backend). `build_parser` makes the argparse parser from the rows (in row order, so --help
reads as the table does) and `config_fields` turns parsed arguments into config keyword
arguments, each through the row's `convert` where the flag's text is not the config's value.
The rows are in `flag_table`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pdworker import __version__

COMMANDS = ("prefill", "decode", "router", "load")


@dataclass(frozen=True)
class Env:
    """A default read from the environment when the parser is built: `$var`, else `fallback`."""

    var: str
    fallback: str | int | Callable[[], str]

    def resolve(self) -> str:
        value = os.environ.get(self.var, "").strip()
        if value:
            return value
        return self.fallback() if callable(self.fallback) else str(self.fallback)


@dataclass(frozen=True)
class Flag:
    name: str  # "--kv-pages"
    type: Callable[[str], Any] | None  # None: the text as is
    default: Any  # a value, or an Env (text, converted by `type` as argparse does)
    help: str
    commands: tuple[str, ...]
    field: str | None = None  # the config field it sets ("model.layers"); None: the process's own
    group: str | None = None  # the --help section; None: the command's plain options
    convert: Callable[[Any], Any] | None = None  # parsed value -> config value (ValueError: bad)
    choices: Sequence[str] | None = None
    metavar: str | None = None
    append: bool = False  # repeatable; the value is the list of every occurrence

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    description: str


def build_parser(
    flags: Sequence[Flag], commands: Sequence[Command], description: str, epilog: str
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdworker", description=description, epilog=epilog)
    parser.add_argument("--version", action="version", version=f"pdworker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands:
        p = sub.add_parser(
            command.name, help=command.help, description=command.description, epilog=epilog
        )
        groups: dict[str, argparse._ArgumentGroup] = {}
        for flag in flags:
            if command.name not in flag.commands:
                continue
            target: Any = p
            if flag.group is not None:
                if flag.group not in groups:
                    groups[flag.group] = p.add_argument_group(flag.group)
                target = groups[flag.group]
            _add(target, flag)
    return parser


def _add(target: Any, flag: Flag) -> None:
    default = flag.default.resolve() if isinstance(flag.default, Env) else flag.default
    extra: dict[str, Any] = {}
    if flag.type is not None:
        extra["type"] = flag.type
    if flag.choices is not None:
        extra["choices"] = list(flag.choices)
    if flag.metavar is not None:
        extra["metavar"] = flag.metavar
    if flag.append:
        extra["action"] = "append"
    target.add_argument(flag.name, default=default, help=flag.help, **extra)


def config_fields(flags: Sequence[Flag], command: str, args: argparse.Namespace) -> dict[str, Any]:
    """The config keyword arguments `command`'s flags set: {"port": 1, "model": {"layers": 2}}.
    A row's `convert` raising ValueError is a bad flag value (the caller names it)."""
    out: dict[str, Any] = {}
    for flag in flags:
        if command not in flag.commands or flag.field is None:
            continue
        value = getattr(args, flag.dest)
        if flag.convert is not None:
            value = flag.convert(value)
        *path, leaf = flag.field.split(".")
        target = out
        for part in path:
            target = target.setdefault(part, {})
        target[leaf] = value
    return out

"""The `pdwarden` command line: run the operator, print CRDs, read a PDDeployment's status.

Why a package: the command parser (`commands`) and the status formatter it prints with
(`status_view`) are the CLI's alone; nothing else in the operator imports them.
"""

from pdwarden.cli.commands import main

__all__ = ["main"]

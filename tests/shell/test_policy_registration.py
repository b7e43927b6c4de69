"""The policy switch: `pdwarden run --no-policies` registers nothing for PDRemediationPolicy, so
kopf never watches the kind (and needs none of its RBAC); by default one daemon per policy."""

from __future__ import annotations

import argparse

from pdwarden.constants import HANDLER_POLICY, HANDLER_POLICY_FORGET, POLICY_PLURAL
from pdwarden.main import RunConfig, build_registry
from pdwarden.run import add_arguments


def watched(config: RunConfig) -> dict[str, set[str]]:
    registry = build_registry(config)
    handlers = [
        *registry._spawning.get_all_handlers(),  # kopf keeps no public listing of handlers
        *registry._changing.get_all_handlers(),
    ]
    out: dict[str, set[str]] = {}
    for h in handlers:
        out.setdefault(str(h.selector.any_name), set()).add(str(h.id))
    return out


def test_policies_are_watched_by_default() -> None:
    assert watched(RunConfig())[POLICY_PLURAL] == {HANDLER_POLICY, HANDLER_POLICY_FORGET}


def test_no_policies_watches_only_pddeployments() -> None:
    assert set(watched(RunConfig(policies=False))) == {"pddeployments"}


def test_the_flag() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).policies is True
    assert parser.parse_args(["--no-policies"]).policies is False

"""The contract every registered engine satisfies, checked over `pdwarden.engines.ENGINES`.

Why a suite of its own: the renderer, the scrape parser, detection and the plan call an engine
only through `Engine` (engines/protocol.py) and never ask its name, so what they rely on is what
this file asserts of every engine at once. A new engine is one module, one registry entry, its
name in `api.spec.Engine` and its fixtures in `FIXTURES` below (the smallest spec of that engine
the API accepts); then every test here runs for it too.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Mapping
from types import UnionType
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from pdwarden.api import PDDeploymentSpec, parse_spec
from pdwarden.api.spec import Engine as EngineName
from pdwarden.constants import (
    ADMIN_TOKEN_DIR,
    BOOTSTRAP_TOKEN_DIR,
    LABEL_DEPLOYMENT,
    LABEL_ROLE,
    ROLE_DECODE,
    ROLE_PREFILL,
    WORKER_PORT,
)
from pdwarden.engines import COUNTER_FIELDS, ENGINES, Engine
from pdwarden.engines.launch import Launch
from pdwarden.engines.protocol import Series
from pdwarden.ownership import selector
from pdwarden.remediation.decide.rungs import PREFILL_RUNGS
from pdwarden.render import Owner, render_deployment
from pdwarden.values import Sample

OWNER = Owner(name="demo", namespace="ns1", uid="uid-1")
WORKER_ROLES = (ROLE_PREFILL, ROLE_DECODE)
OUR_LABELS = {LABEL_DEPLOYMENT, LABEL_ROLE}
# Each engine's fixtures: what its smallest valid spec needs beyond `engine` and `model`.
FIXTURES: Mapping[str, Mapping[str, Any]] = {
    "pdworker": {"prefill": {"gpus": 0}, "decode": {"gpus": 0}},
    "sglang": {"image": "lmsysorg/sglang:v0.5.23", "prefill": {"gpus": 1}, "decode": {"gpus": 1}},
    "vllm": {"image": "vllm/vllm-openai:v0.32.0"},
}
# An environment variable whose name says it holds a credential.
CREDENTIAL = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS?)(_|$)")

NAMES = sorted(ENGINES)


@pytest.fixture(params=NAMES)
def engine(request: pytest.FixtureRequest) -> Engine:
    e: Engine = ENGINES[request.param]
    return e


def spec_of(e: Engine, **patch: Any) -> PDDeploymentSpec:
    raw: dict[str, Any] = {"engine": e.name, "model": {"name": "tiny"}, **FIXTURES[e.name]}
    raw.update(patch)
    return parse_spec(raw)


def by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def pod_spec(objs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    pod: dict[str, Any] = by_kind(objs, "StatefulSet")[f"demo-{role}"]["spec"]["template"]["spec"]
    return pod


def secret_volumes(pod: Mapping[str, Any]) -> dict[str, str]:
    """Secret volumes of a pod: volume name -> Secret name."""
    return {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}


def mounted_at(pod: Mapping[str, Any]) -> set[str]:
    return {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}


def label_sets(command: list[str]) -> list[frozenset[str]]:
    """Each argument that reads as a selector of our labels (k=v terms separated by commas or
    spaces, one of them a pdwarden label) as a set of terms."""
    out = []
    for arg in command:
        terms = [t for t in re.split(r"[,\s]+", arg) if t]
        pairs = [t.split("=", 1) for t in terms if "=" in t]
        if terms and len(pairs) == len(terms) and {k for k, _ in pairs} & OUR_LABELS:
            out.append(frozenset(terms))
    return out


# -- registry and identity -------------------------------------------------------------------


def test_the_spec_literal_names_exactly_the_registered_engines() -> None:
    assert set(get_args(EngineName)) == set(ENGINES)


def test_every_engine_has_its_fixtures() -> None:
    assert set(FIXTURES) == set(ENGINES)


def test_its_name_is_its_registry_key_and_a_spec_value(engine: Engine) -> None:
    assert ENGINES[engine.name] is engine
    assert engine.name in get_args(EngineName)


def _members() -> list[str]:
    return sorted(n for n in vars(Engine) if not n.startswith("_"))


def test_it_is_an_engine_member_by_member(engine: Engine) -> None:
    """A runtime structural check of every member of `Engine`: attributes have the declared
    type, methods take the declared parameters."""
    members = _members()
    assert members, "Engine declares no members"
    for name in members:
        declared = vars(Engine)[name]
        assert hasattr(engine, name), f"{engine.name} lacks {name}"
        value = getattr(engine, name)
        if isinstance(declared, property):
            assert declared.fget is not None
            hint = get_type_hints(declared.fget)["return"]
            # `X | None` and other unions: any of their members; generics: their origin.
            options = get_args(hint) if isinstance(hint, UnionType) else (hint,)
            expected = tuple(get_origin(o) or o for o in options)
            assert isinstance(value, expected), (engine.name, name, value, hint)
        else:
            assert callable(value), (engine.name, name)
            want = list(inspect.signature(declared).parameters)[1:]  # without self
            assert list(inspect.signature(value).parameters) == want, (engine.name, name)


# -- render: its pods and its router -----------------------------------------------------------


@pytest.mark.parametrize("role", WORKER_ROLES)
def test_worker_launch_listens_on_the_worker_port_with_probes(engine: Engine, role: str) -> None:
    launch = engine.worker_launch(spec_of(engine), role, "demo")
    assert isinstance(launch, Launch)
    assert launch.command and launch.command[0], (engine.name, role)
    assert all(isinstance(a, str) for a in launch.command)
    assert "--port" in launch.command, launch.command
    assert launch.command[launch.command.index("--port") + 1] == str(WORKER_PORT)
    probes = launch.probes
    for path in (probes.health_path, probes.ready_path, probes.startup_path or probes.health_path):
        assert path.startswith("/"), (engine.name, role, probes)
    assert probes.health_timeout > 0 and probes.health_period > 0
    assert probes.startup_period > 0 and probes.startup_failures > 0


@pytest.mark.parametrize("role", WORKER_ROLES)
def test_worker_env_carries_no_secret_values(engine: Engine, role: str) -> None:
    """Credentials reach a pod as mounted Secret files: the environment may only say where."""
    spec = spec_of(engine)
    env = engine.worker_launch(spec, role, "demo").env
    token_dirs = (ADMIN_TOKEN_DIR + "/", BOOTSTRAP_TOKEN_DIR + "/")
    for key, value in env.items():
        if CREDENTIAL.search(key):
            assert key.endswith("_FILE") and value.startswith(token_dirs), (engine.name, key)
    container = pod_spec(render_deployment(OWNER, spec), role)["containers"][0]
    assert not [e for e in container["env"] if "secretKeyRef" in str(e.get("valueFrom"))]


def test_router_launch_selects_exactly_the_deployments_prefill_and_decode_pods(
    engine: Engine,
) -> None:
    command = engine.router_launch(spec_of(engine), "demo", "ns1").command
    assert command
    wanted = {frozenset(selector("demo", role).split(",")) for role in WORKER_ROLES}
    found = label_sets(command)
    assert sorted(found, key=sorted) == sorted(wanted, key=sorted), (engine.name, command)
    assert "ns1" in command  # it looks for them in the deployment's namespace


def test_render_deployment_renders_its_spec(engine: Engine) -> None:
    objs = render_deployment(OWNER, spec_of(engine))
    sts = by_kind(objs, "StatefulSet")
    assert set(sts) == {"demo-prefill", "demo-decode"}
    for role in WORKER_ROLES:
        launch = engine.worker_launch(spec_of(engine), role, "demo")
        assert pod_spec(objs, role)["containers"][0]["command"] == launch.command


def test_a_router_is_rendered_with_zero_replicas_only_when_always_routed(engine: Engine) -> None:
    objs = render_deployment(OWNER, spec_of(engine, router={"replicas": 0}))
    routers = by_kind(objs, "Deployment")
    if engine.always_routed:
        assert routers["demo-router"]["spec"]["replicas"] == 0
    else:
        assert routers == {}
    assert "demo-router" in by_kind(render_deployment(OWNER, spec_of(engine)), "Deployment")


def test_the_bootstrap_key_is_mounted_on_both_roles_as_it_says(engine: Engine) -> None:
    objs = render_deployment(OWNER, spec_of(engine))
    for role in WORKER_ROLES:
        pod = pod_spec(objs, role)
        mounted = secret_volumes(pod).get("bootstrap-token") == "demo-bootstrap"
        assert mounted is engine.bootstrap_key, (engine.name, role)
        assert (BOOTSTRAP_TOKEN_DIR in mounted_at(pod)) is engine.bootstrap_key


def test_a_decode_gets_the_discovery_account_only_when_it_lists_prefills(engine: Engine) -> None:
    objs = render_deployment(OWNER, spec_of(engine, router={"replicas": 0}))
    decode, prefill = pod_spec(objs, ROLE_DECODE), pod_spec(objs, ROLE_PREFILL)
    account = decode.get("serviceAccountName")
    assert (account == "demo-router") is engine.decode_lists_prefills
    assert decode["automountServiceAccountToken"] is engine.decode_lists_prefills
    assert "serviceAccountName" not in prefill
    if engine.decode_lists_prefills:  # the account it runs as exists, router or not
        assert account in by_kind(objs, "ServiceAccount")


@pytest.mark.parametrize("role", WORKER_ROLES)
def test_the_admin_token_is_mounted_exactly_where_it_is_needed(engine: Engine, role: str) -> None:
    spec = spec_of(engine)
    pod = pod_spec(render_deployment(OWNER, spec), role)
    needs = engine.needs_admin_token(spec, role)
    assert isinstance(needs, bool)
    assert (secret_volumes(pod).get("admin-token") == "demo-admin") is needs, (engine.name, role)
    assert (ADMIN_TOKEN_DIR in mounted_at(pod)) is needs


# -- observe: its metric table -----------------------------------------------------------------


def _key(s: Series) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    return (s.name, s.target, tuple(sorted(s.select.items())))


def test_its_metric_table_has_unique_entries_feeding_sample_fields(engine: Engine) -> None:
    series = engine.metrics.series
    assert series, engine.name
    keys = [_key(s) for s in series]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
    fields = {f.name for f in dataclasses.fields(Sample)}
    assert {s.target for s in series} <= fields, {s.target for s in series} - fields


def _overlap(s: Series, name: str, select: Mapping[str, str]) -> bool:
    """Whether one sample could count for `s` and also be the probe's (`name`, `select`)."""
    return s.name == name and all(s.select[k] == v for k, v in select.items() if k in s.select)


def test_no_progress_counter_is_a_series_a_probe_moves(engine: Engine) -> None:
    progress = [s for s in engine.metrics.series if s.target in COUNTER_FIELDS]
    assert progress, engine.name  # something can show progress at all
    clashes = [
        (s.name, dict(s.select), dict(select))
        for s in progress
        for name, select in engine.probe_moved
        if _overlap(s, name, select)
    ]
    assert clashes == []


def test_rooms_wait_for_decode_kv_keeps_the_excuse_when_unknown(engine: Engine) -> None:
    assert engine.rooms_wait_for_decode_kv({}, ROLE_DECODE) is True


# -- decide and confirm: its ladder ----------------------------------------------------------


def test_every_prefill_rung_is_a_rung_of_the_ladder(engine: Engine) -> None:
    rungs = dict(engine.prefill_rungs)
    assert set(rungs.values()) <= set(PREFILL_RUNGS), rungs


def test_canary_confirms_decodes_is_a_bool(engine: Engine) -> None:
    assert isinstance(engine.canary_confirms_decodes, bool)

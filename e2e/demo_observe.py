"""What the demo sees once per second: every worker's queue gauges, its pods, the operator's Events.

Why: the narration and the timeline picture need one record of the run, taken at a steady pace
while the scenario drives load and faults from the main thread. One background thread keeps it:
it scrapes each worker pod's /metrics by pod IP, reads the pods and the PDDeployment, and tells
the story of every new operator Event and pod transition as it happens.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, config

from pdwarden.constants import (
    CONDITION_SERVING,
    GROUP,
    KIND,
    LABEL_DEPLOYMENT,
    LABEL_ROLE,
    PLURAL,
    VERSION,
    WORKER_PORT,
)

SERVING = CONDITION_SERVING
EVENT_STORY = {
    "WedgeDetected": "operator DETECTED a wedge",
    "FailRooms": "operator FAILED the wedged rooms on the prefill side",
    "CordonDecode": "operator CORDONED the decode pod (readiness gate False: no new work)",
    "RestartDecode": "operator RESTARTED the decode pod (deleted it; the StatefulSet recreates it)",
    "UncordonDecode": "operator UNCORDONED the decode pod",
}


@dataclass
class Sample:
    """One scrape of one pod: wall time, pod, role, and its pdworker_* series."""

    t: float
    pod: str
    role: str
    values: dict[str, float]


@dataclass
class PodView:
    uid: str
    role: str
    ip: str
    ready: bool
    serving: bool


@dataclass
class Observer:
    kubeconfig: str
    namespace: str
    name: str
    say: Callable[[str], None]
    samples: list[Sample] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # {t, reason, message}
    pods: dict[str, PodView] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        api = config.new_client_from_config(config_file=self.kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self._stop = threading.Event()
        self._seen_events: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="demo-observer", daemon=True)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Observer:
        self._tick(narrate=False)  # the starting point is not news
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._tick(narrate=True)
            except Exception as e:  # a slow API server must not end the story
                self.say(f"(observer: {type(e).__name__}: {e})")
            self._stop.wait(max(0.05, 1.0 - (time.monotonic() - started)))

    # -- one pass ------------------------------------------------------------------------------

    def _tick(self, narrate: bool) -> None:
        pods = self._read_pods()
        self._narrate_pods(pods, narrate)
        with self.lock:
            self.pods = pods
        now = time.time()
        for pod_name, view in sorted(pods.items()):
            values = scrape(f"http://{view.ip}:{WORKER_PORT}/metrics") if view.ip else None
            if values is not None:
                with self.lock:
                    self.samples.append(Sample(now, pod_name, view.role, values))
        self._read_events(narrate)
        obj = self._raw(
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            self.name,
        )
        with self.lock:
            self.status = obj.get("status") or {}

    def _raw(self, method: Callable[..., Any], *args: Any, **kw: Any) -> dict[str, Any]:
        try:
            resp = method(*args, _preload_content=False, _request_timeout=5, **kw)
        except client.ApiException as e:
            if e.status == 404:  # the PDDeployment or namespace is going away
                return {"items": []}
            raise
        data: dict[str, Any] = json.loads(resp.data)
        return data

    def _read_pods(self) -> dict[str, PodView]:
        selector = f"{LABEL_DEPLOYMENT}={self.name}"
        items = self._raw(self.core.list_namespaced_pod, self.namespace, label_selector=selector)
        out = {}
        for p in items["items"]:
            if p["metadata"].get("deletionTimestamp"):
                continue
            conds = {c["type"]: c["status"] for c in (p.get("status") or {}).get("conditions", [])}
            out[p["metadata"]["name"]] = PodView(
                uid=p["metadata"]["uid"],
                role=p["metadata"]["labels"].get(LABEL_ROLE, "?"),
                ip=(p.get("status") or {}).get("podIP", ""),
                ready=conds.get("Ready") == "True",
                serving=conds.get(SERVING, "True") == "True",
            )
        return out

    def _narrate_pods(self, pods: dict[str, PodView], narrate: bool) -> None:
        if not narrate:
            return
        for name, old in self.pods.items():
            new = pods.get(name)
            if new is None:
                self.say(f"{name}: pod deleted; its process and every room in it are gone")
            elif new.uid != old.uid:
                self.say(f"{name}: a new pod (new incarnation) is starting")
            elif new.ready and not old.ready:
                self.say(f"{name}: Ready again, back in the router's rotation")
            elif not new.serving and old.serving:
                self.say(f"{name}: condition {SERVING}=False, the router stops sending it work")
        for name in pods.keys() - self.pods.keys():
            self.say(f"{name}: a new pod (new incarnation) is starting")

    def _read_events(self, narrate: bool) -> None:
        items = self._raw(self.core.list_namespaced_event, self.namespace)["items"]
        fresh = []
        for ev in items:
            uid = ev["metadata"]["uid"]
            if uid in self._seen_events or ev["involvedObject"].get("kind") != KIND:
                continue
            self._seen_events.add(uid)
            if ev.get("reason") in EVENT_STORY:
                fresh.append(ev)
        fresh.sort(key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "")
        for ev in fresh:
            reason, message = ev["reason"], ev.get("message", "")
            first = reason not in {e["reason"] for e in self.events}
            with self.lock:
                self.events.append({"t": time.time(), "reason": reason, "message": message})
            if narrate:
                self.say(event_line(reason, message, first))

    # -- queries for the scenario --------------------------------------------------------------

    def latest(self, pod: str) -> dict[str, float]:
        with self.lock:
            for s in reversed(self.samples):
                if s.pod == pod:
                    return s.values
        return {}

    def snapshot(self) -> tuple[dict[str, PodView], dict[str, Any]]:
        with self.lock:
            return dict(self.pods), dict(self.status)


def event_line(reason: str, message: str, first: bool) -> str:
    """One line per operator Event: the story the first time a reason appears, then the facts.

    The operator's messages start with the action's name (`CordonDecode demo-decode-0: ...`);
    repeating it after `Event CordonDecode:` printed every Event twice, narrated and raw."""
    detail = message.removeprefix(reason).lstrip(" :") or message
    story = f"{EVENT_STORY[reason]}: " if first and reason in EVENT_STORY else ""
    return f"Event {reason}: {story}{shorten(detail)}"


def shorten(text: str, width: int = 150) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def scrape(url: str, timeout: float = 2) -> dict[str, float] | None:
    """The pdworker_* series of one /metrics page (histogram buckets left out); None if down."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
    except (OSError, ValueError):
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith("pdworker_") and "_bucket{" not in line:
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out

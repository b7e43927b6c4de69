"""The bootstrap handshake as pure functions: what a decode may send, and proofs of the key.

Why pure: everything a decode sends to a prefill's bootstrap server is untrusted until it has
been checked here, completely, before the prefill does anything with it (no NIXL call, no peer
replaced, no room touched). Decode uses the same module to build what it sends and to check that
a bootstrap endpoint really is a prefill of its own deployment (`info_proof`) before it hands
over its NIXL metadata and the address of its KV pool.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import re
import struct
from dataclasses import dataclass
from typing import Any

from pdworker import limits
from pdworker.server import BadRequest

# NIXL's serialized agent metadata starts with this tag, then the agent name as a u64-length
# string (NIXL 0.x serdes.cpp, as `nixl_agent.get_agent_metadata()` returns it).
NIXL_METADATA_TAG = b"nixlSerDes|Agent"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MEM_TYPES = ("DRAM", "VRAM")
MAX_DEVICE_ID = 1024
AUTH_SCHEME = "Bearer "
# The bootstrap server's endpoints (prefill serves them, decode calls them).
INFO_PATH = "/bootstrap/info"
PEER_PATH = "/bootstrap/peer"
ROOM_PATH = "/bootstrap/room"
ABORT_PATH = "/bootstrap/abort"
HEARTBEAT_PATH = "/bootstrap/heartbeat"


class Refused(Exception):
    """A well-formed request that the prefill will not honour; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


@dataclass(frozen=True)
class PeerRegistration:
    agent: str
    pod_hint: str  # the peer's own word: never used to decide whom to act on
    ip: str  # verified: the TCP peer address of the authenticated call
    address: str  # ip:port
    incarnation: str
    metadata: bytes
    base_addr: int
    page_bytes: int
    num_pages: int
    device_id: int
    mem_type: str

    def page_descs(self) -> list[tuple[int, int, int]]:
        """NIXL descriptors of every page (large: call it off the event loop)."""
        step, base, dev = self.page_bytes, self.base_addr, self.device_id
        return [(base + i * step, step, dev) for i in range(self.num_pages)]


def _name(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= limits.MAX_NAME_CHARS:
        raise BadRequest(f"{key} must be a string of 1..{limits.MAX_NAME_CHARS} characters")
    if not NAME_RE.fullmatch(value):
        raise BadRequest(f"{key} may hold only letters, digits, '.', '_' and '-'")
    return value


def _int(obj: dict[str, Any], key: str, low: int, high: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"{key} must be an integer in [{low}, {high}]")
    return value


def nixl_agent_name(metadata: bytes) -> str:
    """The agent name NIXL metadata declares; BadRequest if it is not NIXL metadata at all."""
    head = len(NIXL_METADATA_TAG)
    if not metadata.startswith(NIXL_METADATA_TAG) or len(metadata) < head + 8:
        raise BadRequest("metadata is not NIXL agent metadata")
    (size,) = struct.unpack_from("<Q", metadata, head)
    if not 0 < size <= limits.MAX_NAME_CHARS or len(metadata) < head + 8 + size:
        raise BadRequest("metadata names no valid agent")
    try:
        return metadata[head + 8 : head + 8 + size].decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("metadata names no valid agent") from None


def parse_ip(text: str) -> str:
    """A literal IP address in canonical form (no host names: nothing is resolved); an
    IPv4-mapped IPv6 address becomes plain IPv4."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise BadRequest(f"{text[:64]!r} is not an IP address") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def split_address(value: Any) -> tuple[str, int]:
    """`ip:port` (or `[v6]:port`) -> (canonical ip, port)."""
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        raise BadRequest("address must be a string ip:port")
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise BadRequest("address must be ip:port with a port in [1, 65535]")
    return parse_ip(host.removeprefix("[").removesuffix("]")), int(port)


def parse_peer(
    body: dict[str, Any], caller_ip: str, layout: dict[str, Any], page_bytes: int
) -> PeerRegistration:
    """Check a whole peer registration; BadRequest (400) or Refused before any side effect."""
    agent = _name(body, "agent")
    pod = _name(body, "pod")
    incarnation = _name(body, "incarnation")
    ip, port = split_address(body.get("address"))
    if ip != parse_ip(caller_ip):
        raise Refused(403, f"address {ip} is not the caller's address {caller_ip}")
    if body.get("layout") != layout:
        raise Refused(400, "KV layout mismatch", reason="transfer_error")
    raw = body.get("metadata")
    if not isinstance(raw, str) or len(raw) > (limits.MAX_METADATA_BYTES * 4) // 3 + 4:
        raise BadRequest(f"metadata must be base64 of at most {limits.MAX_METADATA_BYTES} bytes")
    try:
        metadata = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("metadata is not valid base64") from None
    if nixl_agent_name(metadata) != agent:
        raise BadRequest("metadata names another agent than the one registering")
    pool = body.get("pool")
    if not isinstance(pool, dict):
        raise BadRequest("pool must be an object")
    if _int(pool, "page_bytes", 1, 2**40) != page_bytes:
        raise Refused(400, "KV page size mismatch", reason="transfer_error")
    num_pages = _int(pool, "num_pages", 1, limits.MAX_PEER_PAGES)
    base = _int(pool, "base_addr", 1, 2**64 - 1)
    if base + num_pages * page_bytes > 2**64:
        raise BadRequest("pool does not fit in a 64-bit address space")
    mem_type = pool.get("mem_type")
    if mem_type not in MEM_TYPES:
        raise BadRequest(f"mem_type must be one of {MEM_TYPES}")
    return PeerRegistration(
        agent=agent,
        pod_hint=pod,
        ip=ip,
        address=format_address(ip, port),
        incarnation=incarnation,
        metadata=metadata,
        base_addr=base,
        page_bytes=page_bytes,
        num_pages=num_pages,
        device_id=_int(pool, "device_id", 0, MAX_DEVICE_ID),
        mem_type=str(mem_type),
    )


def parse_agent(body: dict[str, Any]) -> str:
    return _name(body, "agent")


def parse_pages(value: Any, limit: int) -> list[int]:
    """A room's destination pages: a list of at most `limit` non-negative ints."""
    if not isinstance(value, list) or not 0 < len(value) <= limit:
        raise BadRequest(f"pages must be a list of 1..{limit} page indices")
    for page in value:
        if isinstance(page, bool) or not isinstance(page, int) or not 0 <= page < 2**63:
            raise BadRequest("pages must hold non-negative integer page indices")
    return value


# -- the key ------------------------------------------------------------------------------
def info_proof(token: str, nonce: str, address: str) -> str:
    """What a prefill answers to prove it holds the deployment's key, bound to the address the
    question reached (so a stranger cannot relay a real prefill's answer as its own)."""
    msg = f"pdworker-bootstrap-info\n{nonce}\n{address}".encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def format_address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"

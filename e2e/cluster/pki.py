"""Certificates and keys for the local control plane, made with the openssl CLI.

The API server needs a serving certificate its clients can verify and a key pair for signing
ServiceAccount tokens; a cluster CA ties them together. Nothing here is secret beyond the one
local machine, and everything lives in the cluster's own directory.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_crt: Path
    ca_key: Path
    apiserver_crt: Path
    apiserver_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(directory: Path) -> Pki:
    """Create (once) a CA, an API server certificate for 127.0.0.1/localhost and an SA key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_crt=directory / "ca.crt",
        ca_key=directory / "ca.key",
        apiserver_crt=directory / "apiserver.crt",
        apiserver_key=directory / "apiserver.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )
    if pki.sa_pub.exists():
        return pki
    d = directory
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=d)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "365",
        "-subj", "/CN=pdwarden-local-ca", "-out", "ca.crt", cwd=d,
    )  # fmt: skip
    _openssl("genrsa", "-out", "apiserver.key", "2048", cwd=d)
    ext = d / "apiserver.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "req", "-new", "-key", "apiserver.key", "-subj", "/CN=kube-apiserver",
        "-out", "apiserver.csr", cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "365", "-sha256", "-extfile", "apiserver.ext",
        "-out", "apiserver.crt", cwd=d,
    )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    return pki

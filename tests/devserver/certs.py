"""Test certificates made with ``cryptography``: a CA, a server certificate for a DNS name, a client certificate."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SERVER_NAME = "liftbridge.test"


@dataclass(frozen=True)
class CertFiles:
    """PEM files: the CA, the server's certificate and key, a client's certificate and key (all signed by the CA)."""

    ca: Path
    server: Path
    server_key: Path
    client: Path
    client_key: Path


def _cert(subject: str, key: Any, issuer: tuple[x509.Name, Any] | None, *, ca: bool, san: str | None = None) -> Any:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(obj: Any) -> bytes:
    if hasattr(obj, "private_bytes"):
        return obj.private_bytes(  # type: ignore[no-any-return]
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    return obj.public_bytes(serialization.Encoding.PEM)  # type: ignore[no-any-return]


def make_certs(directory: Path, server_name: str = SERVER_NAME) -> CertFiles:
    """Write a fresh CA, server and client certificate (EC P-256, valid one day) into ``directory``."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", ca_key, None, ca=True)
    objs: dict[str, Any] = {"ca": ca}
    for who, san in (("server", server_name), ("client", None)):
        key = ec.generate_private_key(ec.SECP256R1())
        objs[who] = _cert(who, key, (ca.subject, ca_key), ca=False, san=san)
        objs[f"{who}_key"] = key
    paths: dict[str, Path] = {}
    for name, obj in objs.items():
        paths[name] = directory / f"{name}.pem"
        paths[name].write_bytes(_pem(obj))
    return CertFiles(**paths)

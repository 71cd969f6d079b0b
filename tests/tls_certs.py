"""Test certificates for TLS tests: a throwaway CA, a server certificate and a client certificate.

Generated with ``cryptography`` per test module, so no key material lives in the repository.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: The DNS name in the server certificate (clients override the target name to it).
SERVER_NAME = "liftbridge.test"


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


def make_certs(directory: Path) -> dict[str, Path]:
    """Write PEM files into ``directory`` and return their paths by name: ``ca``, ``server``,
    ``server_key`` (for :data:`SERVER_NAME`), ``client``, ``client_key`` (signed by ``ca``) and
    ``other_key`` (a key that matches no certificate)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", ca_key, None, ca=True)
    objs: dict[str, Any] = {"ca": ca, "other_key": ec.generate_private_key(ec.SECP256R1())}
    for who, san in (("server", SERVER_NAME), ("client", None)):
        key = ec.generate_private_key(ec.SECP256R1())
        objs[who] = _cert(who, key, (ca.subject, ca_key), ca=False, san=san)
        objs[f"{who}_key"] = key
    out = {}
    for name, obj in objs.items():
        path = directory / f"{name}.pem"
        path.write_bytes(_pem(obj))
        out[name] = path
    return out

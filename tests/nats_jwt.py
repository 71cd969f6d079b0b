"""Operator-mode NATS credentials for tests: an operator, an account and a user, each an NKEY
(ed25519), with the JWTs that chain them (operator signs account, account signs user) and the
user's ``.creds`` file. Generated per test module, so no key material lives in the repository.

The claim layout is nats-server's decentralized JWT v2 format (docs.nats.io, "JWTs"): a JWS with
header ``{"typ": "JWT", "alg": "ed25519-nkey"}``, the standard ``jti``/``iat``/``iss``/``sub``/
``name`` claims, and a ``nats`` object carrying the ``type`` (operator, account, user),
``version`` 2 and, for accounts and users, their limits (-1: unlimited; an absent limit is 0 and
would forbid connections and subscriptions).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]

_UNLIMITED = -1


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _new_key(prefix: int) -> Any:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _jwt(signer: Any, subject: Any, name: str, nats: dict[str, Any]) -> str:
    claims: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": signer.public_key.decode(),
        "sub": subject.public_key.decode(),
        "name": name,
        "nats": {**nats, "version": 2},
    }
    # The JWT id: a digest of the claims, as nats' own tools make it (unique per JWT).
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode()
    signing_input = f"{_b64(header)}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(signer.sign(signing_input.encode()))}"


@dataclass(frozen=True)
class OperatorCredentials:
    """What an operator-mode nats-server and its user need.

    :ivar operator_jwt: the operator's self-signed JWT (the server's ``operator``).
    :ivar account_jwt: the account's JWT, signed by the operator (preloaded in the resolver).
    :ivar creds_file: the user's ``.creds`` file: its JWT (signed by the account) and NKEY seed.
    :ivar stranger_creds_file: a ``.creds`` file of a user signed by an account the server does not know.
    """

    operator_jwt: str
    account_jwt: str
    creds_file: Path
    stranger_creds_file: Path


def _creds(user_jwt: str, user: Any) -> str:
    return (
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n"
    )


def make_operator_credentials(directory: Path) -> OperatorCredentials:
    """Generate an operator, an account, a user of it and a user of an unknown account; write the
    ``.creds`` files into ``directory``."""
    operator = _new_key(nkeys.PREFIX_BYTE_OPERATOR)
    account = _new_key(nkeys.PREFIX_BYTE_ACCOUNT)
    limits = {
        "subs": _UNLIMITED,
        "data": _UNLIMITED,
        "payload": _UNLIMITED,
        "imports": _UNLIMITED,
        "exports": _UNLIMITED,
        "wildcards": True,
        "conn": _UNLIMITED,
        "leaf": _UNLIMITED,
    }
    account_jwt = _jwt(operator, account, "liftbridge-tests", {"type": "account", "limits": limits})
    user_limits = {"subs": _UNLIMITED, "data": _UNLIMITED, "payload": _UNLIMITED}
    files = {}
    for name, issuer in (("user", account), ("stranger", _new_key(nkeys.PREFIX_BYTE_ACCOUNT))):
        user = _new_key(nkeys.PREFIX_BYTE_USER)
        path = directory / f"{name}.creds"
        path.write_text(_creds(_jwt(issuer, user, name, {"type": "user", **user_limits}), user))
        path.chmod(0o600)
        files[name] = path
    return OperatorCredentials(
        operator_jwt=_jwt(operator, operator, "liftbridge-test-operator", {"type": "operator"}),
        account_jwt=account_jwt,
        creds_file=files["user"],
        stranger_creds_file=files["stranger"],
    )

"""The project's proto matches the upstream reference in wire terms, and the committed stubs are fresh."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT.parent / "shared" / "reference" / "liftbridge-api" / "api.proto"
PROJECT = ROOT / "proto" / "liftbridge" / "api.proto"


def wire_shape(proto: Path) -> descriptor_pb2.FileDescriptorProto:
    """Compile ``proto`` and keep only what travels on the wire: package, messages, fields, enums, service."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        assert protoc.main(["protoc", f"-I{proto.parent}", f"--descriptor_set_out={out}", proto.name]) == 0
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (fd,) = fds.file
    fd.ClearField("name")
    fd.ClearField("options")  # java_package etc. are not wire terms
    return fd


@pytest.mark.skipif(not REFERENCE.exists(), reason="../shared/reference is not beside this checkout")
def test_project_proto_matches_reference_in_wire_terms() -> None:
    ours, theirs = wire_shape(PROJECT), wire_shape(REFERENCE)
    assert ours.package == "proto"
    assert [s.name for s in ours.service] == ["API"]
    assert ours == theirs


def test_service_has_every_rpc() -> None:
    methods = {m.name for m in wire_shape(PROJECT).service[0].method}
    assert {"CreateStream", "Subscribe", "PublishAsync", "FetchCursor", "SetStreamReadonly"} <= methods
    assert len(methods) == 16


def test_committed_stubs_are_what_the_generator_writes() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr

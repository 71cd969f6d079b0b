"""A gufo-liftbridge client driven over stdin/stdout, run as a child process by the interop tests.

gufo-liftbridge ships its own generated ``proto`` package, which cannot share a process's default
protobuf pool with the project's stubs (both register ``proto.API``), so it runs here, alone: this
file imports nothing from the project. One JSON command per line on stdin, one JSON answer per
line on stdout (``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``). Every command runs
under its own time limit, since gufo retries some failures forever. Commands:

- ``{"do": "create", "stream": S, "partitions": N, "replication_factor": R}``
- ``{"do": "publish", "stream": S, "partition": P, "values": [...], "key": K, "headers": {...}}``
  (values, key and header values are latin-1 strings)
- ``{"do": "subscribe", "stream": S, "partition": P, "count": N, "resume": bool, "wait": secs,
  "cursor_id": C}`` reads from the earliest offset (or, with ``cursor_id``, from gufo's RESUME
  position) until N messages or ``wait`` seconds: ``{"messages": [[offset, value, key, headers]]}``
- ``{"do": "metadata", "stream": S | null}``: ``{"streams": {name: {partition: leader}}}``
- ``{"do": "set_cursor" | "get_cursor", "stream": S, "partition": P, "cursor_id": C, "offset": O}``
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.types import StartPosition

#: Time limit of one command, seconds (a subscription's own ``wait`` is shorter).
COMMAND_LIMIT = 30.0


def _b(text: str | None) -> bytes | None:
    return None if text is None else text.encode("latin-1")


def _s(data: bytes) -> str:
    return data.decode("latin-1")


async def _subscribe(client: LiftbridgeClient, cmd: dict[str, Any]) -> dict[str, Any]:
    messages: list[list[Any]] = []
    kwargs: dict[str, Any] = {"partition": cmd.get("partition", 0), "resume": bool(cmd.get("resume"))}
    if cmd.get("cursor_id"):
        kwargs.update(start_position=StartPosition.RESUME, cursor_id=cmd["cursor_id"])
    else:
        kwargs["start_position"] = StartPosition.EARLIEST

    async def read() -> None:
        async for m in client.subscribe(cmd["stream"], **kwargs):
            messages.append([m.offset, _s(m.value), _s(m.key or b""), {k: _s(v) for k, v in m.headers.items()}])
            if len(messages) >= cmd["count"]:
                return

    try:
        await asyncio.wait_for(read(), cmd.get("wait", 10.0))
    except TimeoutError:
        pass  # fewer messages than asked for: the answer says how many came
    return {"messages": messages}


async def _run(client: LiftbridgeClient, cmd: dict[str, Any]) -> dict[str, Any]:
    do = cmd["do"]
    if do == "create":
        await client.create_stream(
            cmd["stream"],
            partitions=cmd.get("partitions", 1),
            replication_factor=cmd.get("replication_factor", 1),
            wait_for_stream=True,
        )
        return {}
    if do == "publish":
        headers = {k: _b(v) for k, v in cmd.get("headers", {}).items()}
        for value in cmd["values"]:
            await client.publish(
                _b(value), stream=cmd["stream"], partition=cmd.get("partition"), key=_b(cmd.get("key")), headers=headers
            )
        return {}
    if do == "subscribe":
        return await _subscribe(client, cmd)
    if do == "metadata":
        md = await client.get_metadata(cmd.get("stream"))
        return {"streams": {s.name: {str(p.id): p.leader for p in s.partitions.values()} for s in md.metadata}}
    if do == "set_cursor":
        await client.set_cursor(cmd["stream"], cmd["partition"], cmd["cursor_id"], cmd["offset"])
        return {}
    if do == "get_cursor":
        return {"offset": await client.get_cursor(cmd["stream"], cmd["partition"], cmd["cursor_id"])}
    raise ValueError(f"unknown command {do!r}")


async def main(brokers: list[str]) -> None:
    loop = asyncio.get_running_loop()
    async with LiftbridgeClient(brokers) as client:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            cmd = json.loads(line)
            try:
                answer = {"ok": True, **await asyncio.wait_for(_run(client, cmd), COMMAND_LIMIT)}
            except Exception as exc:  # reported to the test, which decides
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1].split(",")))

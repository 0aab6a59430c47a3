"""agent.instances.qmp against a scripted QMP server on a real unix socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from agent.instances.qmp import QmpClient, QmpError

Handler = Callable[[dict[str, object]], list[dict[str, object]]]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[Path, list[Handler]]]:
    path = tmp_path / "q.sock"
    handlers: list[Handler] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b'{"QMP": {"version": {}, "capabilities": []}}\n')
        while line := await reader.readline():
            req = json.loads(line)
            if req["execute"] == "qmp_capabilities":
                replies: list[dict[str, object]] = [{"return": {}}]
            elif req["execute"] == "quit":
                writer.write(b'{"return": {}}\n')
                break
            else:
                replies = handlers.pop(0)(req)
            writer.write(b"".join(json.dumps(r).encode() + b"\n" for r in replies))
        writer.close()

    srv = await asyncio.start_unix_server(serve, str(path))
    async with srv:
        yield path, handlers


async def test_commands_answer_skipping_events_and_errors_are_one_sentence(server: tuple[Path, list[Handler]]) -> None:
    path, handlers = server
    handlers.append(lambda r: [{"event": "STOP"}, {"return": {"status": "paused", "running": False}}])
    handlers.append(lambda r: [{"error": {"class": "GenericError", "desc": "no such thing"}}])
    async with await QmpClient.connect(path) as q:
        assert await q.execute("query-status") == {"status": "paused", "running": False}
        with pytest.raises(QmpError, match=r"^qemu refused cont: no such thing$"):
            await q.execute("cont")
        await q.execute("quit")
        assert await q.closed(5.0)


async def test_a_silent_server_times_out_and_nobody_listening_is_an_oserror(
    server: tuple[Path, list[Handler]], tmp_path: Path
) -> None:
    path, handlers = server
    handlers.append(lambda r: [])
    async with await QmpClient.connect(path, answer_s=0.2) as q:
        with pytest.raises(QmpError, match=r"did not answer within 0\.2 s"):
            await q.execute("query-status")
    with pytest.raises(OSError):
        await QmpClient.connect(tmp_path / "nobody.sock")
    with pytest.raises(QmpError, match="longer than a unix socket path"):
        await QmpClient.connect(tmp_path / ("x" * 120))

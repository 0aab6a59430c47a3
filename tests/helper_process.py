"""A real `bc helper` for a test, and requests to it from a process of another uid (the node's user).

`helper_listening` starts `bc helper` (behind `prefix`, e.g. `unshare -n`) and returns once it logs
`event=helper.listening`; it is terminated when the block ends. `ask_as` runs a short client as `uid` (the
node's user, through `tests.system_user.as_user`) that sends each (op, arguments) in turn and answers each
reply or refusal, so the tests see what an unprivileged agent would.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from tests.e2e.harness import bc_executable
from tests.system_user import as_user

REPO = Path(__file__).resolve().parents[1]

CLIENT = r"""
import asyncio, json, sys
from pathlib import Path
from agent.helper.client import HelperClient, HelperError

async def main():
    client = HelperClient(Path(sys.argv[1]))
    out = []
    for op, args in json.loads(sys.argv[2]):
        try:
            out.append({"ok": await client.call(op, **args)})
        except HelperError as e:
            out.append({"error": str(e)})
    print(json.dumps(out))

asyncio.run(main())
"""


@asynccontextmanager
async def helper_listening(*args: str, prefix: Sequence[str] = ()) -> AsyncIterator[asyncio.subprocess.Process]:
    """`bc helper ARGS…` started (after `prefix`) and listening; terminated and waited for at the end."""
    proc = await asyncio.create_subprocess_exec(
        *prefix, bc_executable(), "helper", *args, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(60):
            while "event=helper.listening" not in (seen[-1] if seen else ""):
                line = (await proc.stderr.readline()).decode()
                assert line, f"bc helper exited before listening: {''.join(seen)}"
                seen.append(line)
        yield proc
    finally:
        proc.terminate()
        await proc.wait()


async def ask_as(uid: int, socket: Path, calls: Sequence[tuple[str, dict[str, object]]]) -> list[dict[str, object]]:
    """Each (op, arguments) asked of the helper at `socket` by a process of `uid`, in order: `{"ok": reply}`
    or `{"error": sentence}` each."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = await asyncio.create_subprocess_exec(
        *as_user(uid), sys.executable, "-c", CLIENT, str(socket), json.dumps(list(calls)),
        cwd="/", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return list(json.loads(out.decode().splitlines()[-1]))

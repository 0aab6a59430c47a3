"""`bc serve`'s process: start the server the composition root builds, say where it listens, stop on a signal."""

from __future__ import annotations

import asyncio
import logging
import signal

from bc.assembly.server import Seams, ServeOptions, Server
from bc.cli.output import echo  # the one writer to the terminal (the data dir's path is the operator's)
from bc.runtime import logs

log = logging.getLogger("bc.serve")


async def run_serve(opts: ServeOptions) -> None:
    logs.setup("serve")
    server = Server(opts, Seams.production())
    await server.start()
    if not server.plan.listens:
        echo("bc serve running the worker role; no listener, no CA or root key (worker key only)")
    else:
        if server.operator_config:
            where = f"operator config {server.operator_config}"
        elif server.plan.worker_key:
            where = "no CA or root key (gateway and worker)"
        else:
            where = "no CA key (gateway only)"
        echo(f"bc serve listening on {server.address}; {where}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    drained = asyncio.create_task(server.stopped.wait())
    try:
        await asyncio.wait([asyncio.create_task(stop.wait()), drained], return_when=asyncio.FIRST_COMPLETED)
    finally:
        log.info("event=serve.stopping")
        await server.stop()
    if server.stop_error is not None:  # stopped on its own, not asked to: say why, with its exit code
        raise server.stop_error

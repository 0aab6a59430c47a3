"""`bc tui`: finds the server and the operator config as every admin command does, then runs the app."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import click

from bc.client.admin import AdminClient
from bc.runtime.config import find_operator_config
from bc.seams.clock import SystemClock
from tui.source import Source


@click.command("tui")
@click.option(
    "--approver-key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Your approver key file, offered when you approve or reject (read for each signature, never kept).",
)
@click.option("--poll", "poll_s", default=5.0, show_default=True, help="Seconds between full reads of the fleet.")
def tui(approver_key: Path | None, poll_s: float) -> None:
    """The live fleet view: fleet, nodes, approvals, jobs, reservations, commands and events."""
    from tui.app import BcTui  # Textual loads only for `bc tui`

    config = find_operator_config()

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[Source]:
        async with AdminClient(config) as client:
            yield client

    app = BcTui(
        connect,
        SystemClock(),
        server=config.server,
        approver_key=str(approver_key) if approver_key else None,
        poll_s=poll_s,
    )
    app.run()


COMMANDS = [tui]

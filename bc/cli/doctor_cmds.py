"""`bc doctor`: check a node's or a server's data dir, one line per check with the fix.

    bc doctor [--data-dir D] [--json]

What D holds decides the checks: `identity.json` makes it a node (see
`agent.doctor`), `pki/` or `bc.db` a `bc serve` data dir (see
`bc.control.doctor.checks`); anything else is bad input (exit 2). Doctor changes
nothing, so it is safe beside a running `bc node` or `bc serve`.

Exit codes: 0 when no check fails (warnings are fine), `ChecksFailed` (exit 9)
when one does, so `bc doctor && next-step` works in a script.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import click

from bc.cli.emit import emit
from bc.cli.output import Lines, lines
from bc.errors import BcError, UsageError
from bc.protocol.findings import FAIL, Finding, ok
from bc.runtime.config import default_data_dir
from bc.seams.clock import SystemClock


class ChecksFailed(BcError):
    """At least one `bc doctor` check failed; the findings were printed."""

    exit_code = 9


def render_findings(findings: list[Finding]) -> Lines:
    """`status  check  message`, with an indented `fix:` line under each warning and failure."""
    width = max(len(f.name) for f in findings)
    out = []
    for f in findings:
        out.append(f"{f.status}  {f.name.ljust(width)}  {' '.join(f.message.split())}")
        if f.fix:
            out.append(f"{' ' * (len(f.status) + 2 + width + 2)}fix: {' '.join(f.fix.split())}")
    counts = Counter(f.status for f in findings)
    out.append(f"{len(findings)} checks: " + ", ".join(f"{counts[s]} {s}" for s in ("pass", "warn", "fail")))
    return lines(out)


def diagnose(data_dir: Path, helper_socket: Path | None = None, tcti: str | None = None) -> tuple[str, list[Finding]]:
    """(role, findings) for what `data_dir` holds."""
    from agent.doctor import run_node_checks
    from agent.identity import Identity
    from bc.control.doctor.checks import is_server_dir, run_server_checks

    if not data_dir.is_dir():
        raise UsageError(f"{data_dir} is not a directory; pass the data dir of a node or of bc serve with --data-dir")
    clock = SystemClock()
    if Identity.exists(data_dir):
        return "node", run_node_checks(data_dir, clock.now(), helper_socket=helper_socket, tcti=tcti)
    if is_server_dir(data_dir):
        return "server", asyncio.run(run_server_checks(data_dir, clock))
    raise UsageError(f"{data_dir} holds neither a node identity (identity.json) nor a bc serve data dir (pki/, bc.db)")


@click.command("doctor")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A node's or bc serve's data dir (default: $BC_DATA_DIR, else /var/lib/bc as root, ~/.local/share/bc).",
)
@click.option(
    "--helper-socket",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A node's bc helper socket: check that it answers and that the agent is not root (found by itself when "
    "the node's data dir is not root's or /run/bc-helper/helper.sock exists).",
)
@click.option(
    "--tcti",
    default=None,
    metavar="TCTI",
    help="How to reach the TPM of a node joined with --attestor tpm (default device:/dev/tpmrm0).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def doctor(data_dir: Path | None, helper_socket: Path | None, tcti: str | None, as_json: bool) -> None:
    """Check a node's or a server's identity, certificates, clock, journal or store."""
    role, findings = diagnose(data_dir or default_data_dir(), helper_socket, tcti)
    emit(
        as_json,
        lambda: {"role": role, "checks": [f.to_json() for f in findings], "ok": ok(findings)},
        lambda: render_findings(findings),
    )
    failures = [f.name for f in findings if f.status == FAIL]
    if failures:
        raise ChecksFailed(
            f"{len(failures)} {'check' if len(failures) == 1 else 'checks'} failed: {', '.join(failures)}"
        )


COMMANDS: tuple[click.Command, ...] = (doctor,)

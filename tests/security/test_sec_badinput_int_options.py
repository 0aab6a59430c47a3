"""Attack: integer options past what the wire can carry (`--cpus 2147483648` overflowed the protobuf
int32 and exited 1 with a ValueError) or what a fleet can have, and seconds that are not finite. Each is
exit 2 naming the option and its range, from the CLI and from the Admin API alike (the same limits
table), and nothing is stored."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bc.client.admin import AdminClient
from bc.errors import UsageError
from bc.runtime.config import OperatorConfig
from tests.e2e.harness import bc_executable, free_port
from tests.integration.test_cli_cmd import Lab, bc, lab, ok_json

__all__ = ["lab"]


@pytest.mark.parametrize(
    ("option", "value", "bound"),
    [
        ("--cpus", "2147483648", "65536"),
        ("--cpus", "9223372036854775808", "65536"),
        ("--hugepages-1g", "2147483648", "65536"),
        ("--gpus", "2147483648", "1024"),
        ("--memory", "99999999999T", "max_memory_bytes"),
    ],
)
def test_an_integer_option_out_of_range_is_exit_2_naming_it(lab: Lab, option: str, value: str, bound: str) -> None:
    args = ["reserve", "--gpus", "1", option, value] if option != "--gpus" else ["reserve", "--gpus", value]
    r = bc(*args)
    assert r.exit_code == 2, r.output
    assert option in r.stderr and bound in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert ok_json("reservations", "--all") == []


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [
        ("cpus", 2**31 - 1, "max_cpus"),
        ("hugepages_1g", 2**31 - 1, "max_hugepages_1g"),
        ("memory_bytes", 2**63 - 1, "max_memory_bytes"),
    ],
)
def test_the_admin_api_checks_the_same_table(lab: Lab, field: str, value: int, limit: str) -> None:
    async def call() -> None:
        async with AdminClient(OperatorConfig.load(lab.server.operator_config)) as c:  # type: ignore[arg-type]
            await c.reserve(1, **{field: value})  # type: ignore[arg-type]

    with pytest.raises(UsageError) as refused:
        lab.run(call())
    assert limit in refused.value.message


@pytest.mark.parametrize(
    ("args", "bound"),
    [(("approvers", "threshold", "2147483648"), "100"), (("approvers", "allowance", "2147483648"), "1000")],
)
def test_quorum_numbers_past_the_wire_are_exit_2_naming_the_range(lab: Lab, args: tuple[str, ...], bound: str) -> None:
    r = bc(*args)
    assert r.exit_code == 2, r.output
    assert bound in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "-0"])
def test_seconds_that_are_not_finite_are_exit_2_before_bc_serve_starts(tmp_path: Path, value: str) -> None:
    """`click.FloatRange` let `nan` through (it compares false with every bound): `bc serve
    --heartbeat-interval nan` started a server whose timers never fired."""
    data_dir = tmp_path / "server"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "BC_DATA_DIR": str(data_dir)}
    argv = ["serve", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{free_port()}"]
    r = subprocess.run(
        [bc_executable(), *argv, "--heartbeat-interval", value],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2 and "--heartbeat-interval" in r.stderr, (r.returncode, r.stderr[-800:])
    assert not data_dir.exists(), "bc serve started"

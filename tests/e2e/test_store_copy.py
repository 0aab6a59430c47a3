"""A lab grows into a fleet: `bc store copy` from its SQLite file to PostgreSQL, and the fleet carries on.

Real processes throughout: a lab on SQLite with a live hold, settled commands, a finished job, a batch
waiting for its quorum and usage on the books; `bc serve` stopped; the store copied (verified per
table); `bc serve --store postgresql://…` on the same data dir. The nodes come back with the
identities they have, the hold stays where it was, the waiting batch is approved and runs once per
node, and new commands run.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.pg import fresh_schema_sync, schema_url

from .harness import Lab
from .test_quorum import add_approvers, create_reset_batch, resets, sign, start_nodes

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]


def usage_total(lab: Lab) -> int:
    return sum(int(r["atom_ms"]) for r in lab.bc("usage", "--by", "reservation"))


def test_a_lab_copied_to_postgresql_carries_on_with_its_holds_batches_jobs_and_usage(lab: Lab) -> None:
    gpus = start_nodes(lab, ["n1", "n2"])
    hold = lab.bc("reserve", "--gpus", "2", "--node", "n1")
    lab.wait_reservation_state(hold["id"], "active")
    cdi = lab.cdi_path("n1", hold["allocation_id"])
    assert cdi.exists()
    done = lab.bc("cmd", "run", "n1", "inventory.refresh", "--wait")
    assert done["state"] == "succeeded", done
    job = lab.bc("jobs", "run", "reboot", "n2", "--no-wait")
    ended = lab.wait_job_terminal(job["id"])
    assert ended["state"] == "done", ended
    people = add_approvers(lab, k=2)
    batch = create_reset_batch(lab, {"n2": gpus["n2"]})
    used_before = usage_total(lab)

    lab.kill("serve", signal.SIGTERM)  # the fleet is stopped; the nodes keep running and enforcing
    with fresh_schema_sync() as (url, schema):
        target = schema_url(url, schema)
        copied = {
            t["table"]: t
            for t in lab.bc("store", "copy", "--from", str(lab.server_dir / "bc.db"), "--to", target)["tables"]
        }
        for table in (
            "nodes",
            "node_certs",
            "reservations",
            "device_bookings",
            "commands",
            "job_dags",
            "batches",
            "approvers",
            "events",
        ):
            assert copied[table]["rows"] > 0, (table, copied[table])
        again = lab.run("store", "copy", "--from", str(lab.server_dir / "bc.db"), "--to", target)
        assert again.returncode == 4 and "not empty" in again.stderr, again.stderr

        lab.serve(store=target)
        for node_id in ("n1", "n2"):
            lab.wait_for(f"{node_id} to reconnect", lambda n=node_id: lab.show(n)["state"] == "connected")
        assert lab.reservation(hold["id"])["state"] == "active"  # type: ignore[index]
        assert cdi.exists()
        assert usage_total(lab) >= used_before

        sign(lab, batch["id"], people["alice"])
        sign(lab, batch["id"], people["bob"])
        lab.wait_for("the batch's reset to run on n2", lambda: resets(lab, "n2").get(gpus["n2"], 0) == 1)
        after = lab.bc("cmd", "run", "n1", "inventory.refresh", "--wait")
        assert after["state"] == "succeeded", after
        check: Any = lab.bc("store", "check", "--store", target)
        assert check["dialect"] == "postgres" and check["schema_version"] == check["bc_schema_version"], check
        lab.kill("serve", signal.SIGTERM)

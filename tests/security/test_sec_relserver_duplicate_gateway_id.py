"""Attack (or slip): a second `bc serve --gateway-id gw-a` on the store where gw-a already runs (a unit copied
to a second host, a data dir copied without changing the id). Before, both held the lease `gateway:gw-a`
under the one holder name `gw-a`, so both routed gw-a's nodes and ran the singletons. Now the second is
refused at start, exit 4, with one sentence naming the running holder, and the first serves on."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import lab
from tests.e2e.harness import Lab
from tests.pg import fresh_schema_sync, schema_url
from tests.security.relserver_gateway_helpers import lease_row, run_serve, serve_gateway

__all__ = ["lab"]

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]


def test_a_second_bc_serve_with_a_running_gateways_id_exits_4_naming_the_holder(lab: Lab) -> None:
    with fresh_schema_sync() as (url, schema):
        store = schema_url(url, schema)
        serve_gateway(lab, "gw-a", lab.server_dir, store, "gw-a")
        holder, _, epoch = lease_row(url, schema, "gateway:gw-a") or ("", 0, 0)
        assert holder.startswith("gw-a@") and str(lab.server_dir) in holder, holder

        copy = lab.root / "server-copy"
        lab.copy_server_dir(copy)
        second = run_serve(lab, copy, store, "gw-a")
        assert second.returncode == 4, (second.returncode, second.stderr[-2000:])
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, second.stderr[-2000:]
        assert "gateway gw-a is already running on this store" in errors[0] and holder in errors[0], errors
        assert "Traceback" not in second.stderr

        assert lab.procs["gw-a"].popen.poll() is None, "the running gateway stopped"
        row = lease_row(url, schema, "gateway:gw-a")
        assert row is not None and (row[0], row[2]) == (holder, epoch), row  # the lease never moved
        assert lab.bc("nodes") == []  # and still answers

"""Attack (or slip): a second gateway under the same id sneaks past the start check, because the first was
paused past its lease's TTL; then the first comes back. Before, both went on as gw-a, and each, being keyless,
asked the api for a serving certificate for its own key in turn, forever (each one's certificate was not
usable with the other's key). Now the lease's epoch fences the stale one: at its first renewal it finds a
later epoch, stops acting and exits 4 saying so, and no more certificates are requested for gw-a."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.e2e.conftest import lab
from tests.e2e.harness import Lab
from tests.pg import fresh_schema_sync, schema_url
from tests.security.relserver_gateway_helpers import count_events, expire_lease, lease_row, serve_gateway

__all__ = ["lab"]

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]


def test_the_stale_gateway_is_fenced_by_the_lease_epoch_and_no_certificate_loop_follows(lab: Lab) -> None:
    with fresh_schema_sync() as (url, schema):
        store = schema_url(url, schema)
        serve_gateway(lab, "api", lab.server_dir, store, "api", "--roles", "api")
        serve_gateway(lab, "gw-a", lab.root / "gw-a", store, "gw-a", "--roles", "gateway")
        first = lease_row(url, schema, "gateway:gw-a")
        assert first is not None and str(lab.root / "gw-a") in first[0], first

        stale = lab.procs["gw-a"].popen
        os.kill(stale.pid, signal.SIGSTOP)  # paused (a VM migration, a debugger) past its lease's TTL
        try:
            # If it froze inside its lease renewal, the row stays locked until the server ends that transaction
            # (bc.store.postgres.IDLE_IN_TRANSACTION_S): the expiry below waits that long at most.
            expire_lease(url, schema, "gateway:gw-a")
            serve_gateway(lab, "gw-a-twin", lab.root / "gw-a-twin", store, "gw-a", "--roles", "gateway")
            taken = lease_row(url, schema, "gateway:gw-a")
            assert taken is not None and str(lab.root / "gw-a-twin") in taken[0] and taken[2] == first[2] + 1, taken
        finally:
            os.kill(stale.pid, signal.SIGCONT)  # a failure above must not leave it frozen on its locks

        lab.wait_for("the stale gw-a to exit", lambda: stale.poll() is not None, timeout=30)
        assert stale.returncode == 4, stale.returncode
        log = lab.log("gw-a")
        assert "event=gateway.superseded" in log and "took its lease at epoch" in log, log[-2000:]
        assert lab.procs["gw-a-twin"].popen.poll() is None, "the gateway that holds the lease stopped"

        # No re-issue loop: with the stale one gone, the count of requests for gw-a stays where it is.
        asked = count_events(url, schema, "pki.serving-cert.requested", "gw-a")
        deadline = time.monotonic() + 4  # four passes of the keyless loop (1 s) and of the api's issuer
        while time.monotonic() < deadline:
            assert count_events(url, schema, "pki.serving-cert.requested", "gw-a") == asked
            time.sleep(0.25)
        assert asked <= 3, f"{asked} serving certificates requested for gw-a"
        row = lease_row(url, schema, "gateway:gw-a")
        assert row is not None and row[0] == taken[0] and row[2] == taken[2], row

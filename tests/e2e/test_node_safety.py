"""No input wedges a node's lane, and a lost journal drops no hold: issue 10, items 3 and 4, over real processes.

* A malformed upload URL (`http://[::1/x`, a port of 99999) settles `failed` with `invalid-payload`, and the
  bulk lane goes on: before the fix the first one stayed unsettled holding its bulk credit until the kind's
  timeout, and the second settled `internal`.
* `logs.collect` uploads only under the node's own `--upload-allow`; anything else is `forbidden-target`,
  nothing is dialled, and the tarball is kept on the node.
* kill -9 `bc serve`, stop n1, overwrite its `journal.db`, start n1: n1 keeps every hold in its CDI directory
  (before the fix it released them all at generation 0 until the server came back), then the server's spec
  keeps them, and a release (a signed spec saying otherwise) removes them.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from tests.http_server import serving

from .harness import HEARTBEAT_S, Lab, always, assert_no_tracebacks, bring_up, read_cdi
from .test_commands import assert_outcome, run, wait_reconnected, wait_settled

NO_PROXY = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def start_node(lab: Lab, node_id: str, *extra: str) -> None:
    """`bc node` as `Lab.node` starts it, plus extra flags (the harness has no place for them)."""
    lab.spawn(
        f"node-{node_id}",
        "node",
        "--data-dir",
        str(lab.node_dir(node_id)),
        "--fake-hw",
        "hgx-h100-8",
        "--heartbeat-interval",
        str(HEARTBEAT_S),
        *extra,
        env=NO_PROXY,
    )


@pytest.fixture
def upload_server() -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """An HTTP server on 127.0.0.1 that records every request (path, body size) and answers 200."""
    seen: list[tuple[str, int]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.path, len(body)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PUT

        def do_GET(self) -> None:
            seen.append((self.path, 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url, seen


def collect(lab: Lab, payload: dict[str, Any]) -> dict[str, Any]:
    """`bc cmd run n1 logs.collect --payload JSON`, settled (20 s: a wedged lane never settles)."""
    return wait_settled(lab, run(lab, "n1", "logs.collect", "--payload", json.dumps(payload))["id"])


# -- issue 10, item 3: a malformed URL wedges a lane ------------------------------------------------


@pytest.mark.e2e
def test_a_malformed_upload_url_is_invalid_payload_and_the_bulk_lane_goes_on(
    lab: Lab, upload_server: tuple[str, list[tuple[str, int]]]
) -> None:
    base, seen = upload_server
    lab.serve()
    lab.join("n1")
    start_node(lab, "n1")
    lab.wait_converged("n1")

    bad = collect(lab, {"upload_url": "http://[::1/x"})
    assert_outcome(bad, "failed", "invalid-payload")
    assert "http://[::1/x" in bad["message"] and "is not a URL" in bad["message"], bad
    port = collect(lab, {"upload_url": "http://127.0.0.1:99999/x"})
    assert_outcome(port, "failed", "invalid-payload")
    assert "99999" in port["message"], port

    # More bulk commands than the lane's 2 credits, one after another: none waits on a credit held by the above.
    for _ in range(3):
        assert_outcome(collect(lab, {}), "succeeded")

    # No --upload-allow on this node: a well-formed URL is refused and never dialled; the tarball stays here.
    refused = collect(lab, {"upload_url": f"{base}/up/n1.tar.gz?sig=secret"})
    assert_outcome(refused, "failed", "forbidden-target")
    assert "secret" not in json.dumps(refused), refused
    kept = refused["result"]["path"]
    assert kept.startswith(str(lab.node_dir("n1") / "logs")), refused["result"]
    assert (lab.node_dir("n1") / "logs" / kept.rsplit("/", 1)[-1]).is_file()
    assert seen == [], f"the node dialled a URL its operator did not allow: {seen}"
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_uploads_go_only_under_the_nodes_own_allowlist(
    lab: Lab, upload_server: tuple[str, list[tuple[str, int]]]
) -> None:
    base, seen = upload_server
    lab.serve()
    lab.join("n1")
    start_node(lab, "n1", "--upload-allow", f"{base}/bc/")
    lab.wait_converged("n1")

    ok = collect(lab, {"upload_url": f"{base}/bc/n1.tar.gz?sig=secret"})
    assert_outcome(ok, "succeeded")
    assert ok["result"]["uploaded_to"] == f"{base}/bc/n1.tar.gz", ok["result"]
    assert [path for path, _ in seen] == ["/bc/n1.tar.gz?sig=secret"]
    assert seen[0][1] == ok["result"]["bytes"]

    # What the control plane cannot make the node do: another path, a look-alike prefix, a climb out of it.
    for url, reason in [
        (f"{base}/bcx/n1.tar.gz", "forbidden-target"),
        (f"{base}/other/n1.tar.gz", "forbidden-target"),
        (f"{base}/bc/../admin", "invalid-payload"),
        (f"{base}/bc/%2e%2e/admin", "invalid-payload"),
    ]:
        assert_outcome(collect(lab, {"upload_url": url}), "failed", reason)
    assert len(seen) == 1, f"the node dialled outside its allowlist: {seen}"
    assert_no_tracebacks(lab)


# -- issue 10, item 4: a lost journal drops live holds while the control plane is away ----------------


@pytest.mark.e2e
def test_a_lost_journal_keeps_every_hold_until_a_signed_spec_says_otherwise(lab: Lab) -> None:
    before = bring_up(lab, {"n1": "hgx-h100-8"})["n1"]
    res = lab.bc("reserve", "--gpus", "2", "--node", "n1")
    aid = res["allocation_id"]
    lab.wait_reservation_state(res["id"], "active")
    cdi = lab.cdi_path("n1", aid)
    env_file = lab.node_dir("n1") / "allocations" / f"bc-{aid}.env"
    lab.wait_for(f"the CDI spec {cdi.name}", lambda: read_cdi(cdi))
    held = lab.wait_converged("n1")
    spec_bytes = cdi.read_bytes()
    assert env_file.is_file(), sorted(p.name for p in env_file.parent.iterdir())

    lab.kill("serve")  # kill -9
    assert lab.kill("node-n1", signal.SIGTERM) == 0, "bc node did not stop cleanly on SIGTERM"
    journal = lab.node_dir("n1") / "journal.db"
    journal.write_bytes(b"overwritten: not a journal \x00\xff" * 256)

    with always(f"the CDI spec {cdi.name} exists", cdi.exists), always(f"{env_file.name} exists", env_file.exists):
        lab.restart("node-n1")
        # The first converge pass of the new process decides, and logs what it did with the hold.
        adopted, released = (
            f"event=allocation.adopted allocation={aid} ",
            f"event=allocation.released allocation={aid} ",
        )
        lab.wait_for(
            "n1's first converge pass over its new journal",
            lambda: adopted in lab.log("node-n1") or released in lab.log("node-n1"),
        )
        assert released not in lab.log("node-n1"), "n1 released a live hold on its own, with no spec to say so"
        assert cdi.exists() and adopted in lab.log("node-n1")
        assert list(lab.node_dir("n1").glob("journal.db.corrupt-*")), "the overwritten journal was not moved aside"

        lab.restart("serve")
        after = wait_reconnected(lab, "n1", before["session_epoch"])
        assert after["journal_id"] and after["journal_id"] != held["journal_id"], (held, after)
        g = held["generation"]

        def spec_applied() -> dict[str, Any] | None:
            doc = lab.show("n1")
            devices = {x["section"]: x for x in doc["sections"]}.get("devices", {})
            return doc if doc["applied_generation"] == g and devices.get("state") == "CONVERGED" else None

        lab.wait_for(f"n1 applying the server's spec (generation {g}) to the adopted hold", spec_applied)
        reservation = lab.reservation(res["id"])
        assert reservation is not None and reservation["state"] == "active", reservation
    assert cdi.read_bytes() == spec_bytes, "the adopted hold was rewritten"
    assert released not in lab.log("node-n1")

    # A signed spec without the assignment: now it goes.
    lab.bc("release", res["id"], json=False)
    lab.wait_for(f"the CDI spec {cdi.name} removed", lambda: not cdi.exists())
    lab.wait_for(f"{env_file.name} removed", lambda: not env_file.exists())
    lab.wait_reservation_state(res["id"], "released")
    assert_no_tracebacks(lab)

"""The health screen (`7`) against a real `bc serve` with a fake-GPU node: an injected XID, what the
policy does with it and why it waits, and a person's GPU cordon, read from the same `GetHealth` as `bc health`."""

from __future__ import annotations

import json

from bc.runtime.config import OperatorConfig
from tests.integration.conftest import InprocLab
from tests.tui.conftest import SIZE, make_app, until
from tests.tui.test_actions_live import connected
from tui.screens.health import HealthScreen


async def test_the_health_screen_shows_the_condition_the_queue_with_its_reason_the_cordon_and_the_limits(
    lab: InprocLab,
) -> None:
    await connected(lab, "n1")
    node = await lab.admin.get_node("n1")
    gpu0, gpu1 = sorted(node.inventory.gpus, key=lambda g: g.index)[:2]
    await lab.admin.set_health_policy(json.dumps({"limits": {"max_actions_per_hour": 0}}), "watch only")
    await lab.admin.cordon_gpu("n1", "1", "fan noise")
    (lab.node_dir("n1") / "fake-faults").write_text("xid79:0\n")
    app = make_app(OperatorConfig.load(lab.server.operator_config))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.link.live)
        await pilot.press("7")
        screen = app.screen
        assert isinstance(screen, HealthScreen)

        def groups() -> dict[str, list[list[str]]]:
            t = screen.query_one("#health")
            out: dict[str, list[list[str]]] = {}
            for key in screen.keys:
                row = [str(c) for c in t.get_row(key)]  # type: ignore[attr-defined]
                out.setdefault(row[0], []).append(row)
            return out

        await until(pilot, lambda: "queue" in groups(), timeout=30, what="the XID's episode in the queue")
        g = groups()
        shown = screen.info
        assert shown is not None
        (why,) = [e.wait_reason for e in shown.queue]
        assert why == "the hourly limit: 0 automatic action(s) in the last hour"

        def whole(cell: str, text: str) -> bool:  # a free-text cell is clipped to the terminal's width
            return text.startswith(cell.removesuffix("…"))

        (sick,) = g["sick"]
        assert sick[1] == "n1" and whole(sick[2], gpu0.uuid) and sick[3] == "Xid79" and whole(sick[4], "xid:79 → reset")
        (queued,) = g["queue"]
        assert queued[1] == "n1" and whole(queued[2], gpu0.uuid) and whole(queued[7], why) and len(queued[7]) > 8
        cordons = sorted((r[3], r[7]) for r in g["cordon"])
        assert [c[0] for c in cordons] == ["cordoned", "cordoned"]
        (manual,) = [c for c in shown.cordons if not c.episode_id]
        assert manual.gpu_uuid == gpu1.uuid and manual.reason.endswith(": fan noise")
        assert any(whole(r, manual.reason) for _, r in cordons)
        limits = str(screen.query_one("#health-limits").render())
        assert limits.startswith("policy v1 · 0 of 1 node(s) in remediation · 0 of 0 automatic action(s)")
        await pilot.press("q")

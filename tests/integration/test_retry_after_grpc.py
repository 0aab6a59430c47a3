"""An overloaded gateway's refusal over real gRPC: RESOURCE_EXHAUSTED with `bc-retry-after-ms` in the trailing
metadata, read back by the production agent, which redials after it (bc.gateway.admission)."""

from __future__ import annotations

import logging
import random
import time

import pytest

from bc.gateway.admission import Admission, Turn
from tests.integration.conftest import InprocLab

RETRY_AFTER_S = 1.5


class RefuseTwice(Admission):
    """The first two new streams and the first Hello refused, each told to come back in 1.5 s."""

    def __init__(self, now: float) -> None:
        super().__init__(refilled_at=now)
        self.handshakes_to_refuse, self.hellos_to_refuse = 1, 1

    def handshake(self, now: float) -> bool:
        if self.handshakes_to_refuse:
            self.handshakes_to_refuse -= 1
            return False
        return super().handshake(now)

    def hello(self, now: float) -> Turn:
        if self.hellos_to_refuse:
            self.hellos_to_refuse -= 1
            return Turn.REFUSE
        return super().hello(now)

    def retry_after(self, now: float, rng: random.Random) -> float:
        return RETRY_AFTER_S


async def test_a_node_refused_at_the_stream_and_at_the_hello_comes_back_after_each_retry_after(
    lab: InprocLab, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent")
    gw = lab.server.gateway
    gw.admission = RefuseTwice(gw.clock.monotonic())
    await lab.join("n1")
    started = time.monotonic()
    await lab.start_node("n1")
    await lab.wait_connected("n1", timeout=30)
    took = time.monotonic() - started
    # Refused by the handshake bucket (the servicer's abort), then at the Hello (the session's close), each
    # with its retry-after in the trailing metadata: two waits of 1.5 s, no back-off step (which could be 0).
    assert gw.counters.streams_refused == 2
    assert 2 * RETRY_AFTER_S <= took < 2 * RETRY_AFTER_S + 10
    redials = [r.getMessage() for r in caplog.records if "event=session.redial" in r.getMessage()]
    assert redials[:2] == ["event=session.redial attempt=0 delay_s=1.500"] * 2, redials

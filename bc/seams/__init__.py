"""The seams product code is given instead of the world: the clock, virtual time, ids, the session `Link`
and the one in-memory network that carries it.

`bc serve` and `bc node` pass the real ones (the loop's clock, a gRPC `Link` from `bc.wire.link`); `bc sim`
and the tests pass virtual time and the in-memory network. Fake hardware is the agent's own seam
(`agent.hw.open_backend`), since bc.seams sits below the agent.
"""

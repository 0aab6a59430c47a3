"""The seams product code is given instead of the world: the clock, virtual time, ids, the in-memory network.

`bc serve` passes the real ones; `bc sim`, `bc node --fake-hw`, `make demo` and the tests pass these.
"""

"""`bc sim`: the production control plane, gateway and agent code on virtual time, under seeded chaos.

* `links`: in-memory links with seeded delays, drops, duplicates, reordering, partitions, half-open links,
  resets and stalls (the same `Link` the gRPC adapters implement).
* `facts`, `checkers`: what a run records, and the fleet invariants (I1, I2, I3, I4, I5, I7, I8) as pure
  functions over it; I1, I5, I7 and I8 are the capacity checkers of `bc.control.capacity.invariants`.
* `breaks`: deliberately broken components, substituted through seams, that the checkers must catch.
* `chaos`, `fleet`: the fault schedule and the simulation that runs it over `SessionPair`'s wiring.
* `gateways`, `process_store`, `bus_hub`: with `--gateways N`, N gateway processes on the one store (killed,
  stalled, the store taken out), the nodes' dial over all of them, and the wake-ups between processes.
* `workload`, `report`: what the fleet is asked to do, and the summary an operator reads.
"""

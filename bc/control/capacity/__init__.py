"""Capacity: atoms, the placement pass, reservations, usage windows and the invariants (docs/capacity.md)."""

"""Nodes and connectivity: the NodeSpec writer, liveness, status reports, taking a node out."""

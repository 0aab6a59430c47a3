"""Convergence: one converger per NodeSpec section, run in the spec's section order."""

"""Bare metal on the control plane (docs/metal.md, "Provisioning as jobs").

machines.py   enroll, list, show, remove: the machines table and the site section's `machines[]` together
plan.py       pure: what a provisioning job does to each machine (node ids, payloads), from the rows
views.py      what clients see of a machine (plain data, shared by the CLI, the TUI and tests)
"""

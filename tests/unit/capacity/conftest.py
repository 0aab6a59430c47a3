"""The capacity core's tests need no fixture: they build plain facts (`fleet.py`) and call pure functions."""

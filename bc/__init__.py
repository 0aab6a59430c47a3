"""bc: an operations toolkit for GPU fleets."""

from __future__ import annotations

import os

# grpc reads this once, at its first import: set it before any module imports grpc,
# or failed TLS handshakes are logged at INFO on every probe.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("bc")
    except Exception:  # not installed (a zipapp or a source tree): say so rather than guess
        return "0.0.0+unknown"


def __getattr__(name: str) -> str:
    # `__version__` is read on first use: importlib.metadata costs ~30 ms that a CLI call rarely needs.
    if name == "__version__":
        value = _version()
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bc' has no attribute {name!r}")

"""Suite-wide setup. grpc reads GRPC_VERBOSITY once, at its first import, so set it before anything imports grpc."""

import os

import pytest
from hypothesis import settings

from tests.loops import loop_factories, register_markers

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# The gate (.ci/run sets BC_HYPOTHESIS_PROFILE=gate) replays the same examples on every run, so what
# passed here passes there; a developer's `make test` explores new examples each time and keeps what
# failed in .hypothesis/ to replay first.
settings.register_profile("gate", derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("BC_HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config: pytest.Config) -> None:
    register_markers(config)


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> object:
    """The virtual-time loop for tests/unit and tests marked `virtual_time`, else the ordinary loop (tests/loops.py)."""
    return loop_factories(config, item)

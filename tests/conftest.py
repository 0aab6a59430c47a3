"""Suite-wide setup. grpc reads GRPC_VERBOSITY once, at its first import, so set it before anything imports grpc."""

import os

import pytest

from tests.loops import loop_factories, register_markers

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def pytest_configure(config: pytest.Config) -> None:
    register_markers(config)


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> object:
    """The virtual-time loop for tests/unit and tests marked `virtual_time`, else the ordinary loop (tests/loops.py)."""
    return loop_factories(config, item)

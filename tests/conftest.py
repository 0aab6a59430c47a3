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


# The files that build binaries (minutes of PyInstaller) start first, so under `-n 2 --dist loadfile`
# one worker builds while the other runs everything else, instead of the build starting last.
SLOW_FIRST = (
    "tests/e2e/test_self_update.py",
    "tests/e2e/test_dist.py",
    "tests/sim/test_sim_heavy_seeds.py",
    "tests/sim/test_sim_heavy_seeds_more.py",
    "tests/sim/test_session_pair.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its order

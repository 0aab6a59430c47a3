"""Suite-wide setup. grpc reads GRPC_VERBOSITY once, at its first import, so set it before anything imports grpc."""

import os

import pytest
from hypothesis import settings

from tests.home_sandbox import HomeSandbox
from tests.loops import loop_factories, register_markers

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# No test writes outside its temporary directories: before any test (or any module a test imports) reads
# the environment, HOME, XDG_CONFIG_HOME and BC_DATA_DIR point into a scratch directory of this process's
# own, and BC_CONFIG is unset (tests/home_sandbox.py says why). The real places are fingerprinted now and
# checked when the session ends.
SANDBOX = HomeSandbox.enter()

# The gate (.ci/run sets BC_HYPOTHESIS_PROFILE=gate) replays the same examples on every run, so what
# passed here passes there; a developer's `make test` explores new examples each time and keeps what
# failed in .hypothesis/ to replay first.
settings.register_profile("gate", derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("BC_HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config: pytest.Config) -> None:
    register_markers(config)
    config.addinivalue_line("markers", "slow: a slow test of real parts; `make test-slow` runs these")


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> object:
    """The virtual-time loop for tests/unit and tests marked `virtual_time`, else the ordinary loop (tests/loops.py)."""
    return loop_factories(config, item)


# The files whose tests are slow by nature (PyInstaller builds, the heavy simulator seeds): marked `slow`,
# so `make test` (-m "not slow") stays within its ten minutes on 2 cores and `make test-slow` runs them.
# They start first, so under `-n 2 --dist loadfile` one worker builds while the other runs the rest.
SLOW_FILES = (
    "tests/e2e/test_self_update.py",
    "tests/e2e/test_dist.py",
    "tests/sim/test_sim_heavy_seeds.py",
    "tests/sim/test_sim_heavy_seeds_more.py",
    # An hour of a hundred agents twice over, and a real PostgreSQL outage: a minute and a half of the
    # 10-minute budget of `make test` on 2 cores between them.
    "tests/sim/test_session_pair.py",
    "tests/integration/test_pg_outage.py",
    # A real bc serve whose store dies under every role's loops, on the host's clock (the sweeper passes every
    # 5 s): half a minute, and `make test` stood at 10 min 11 s on 2 cores with it.
    "tests/integration/test_store_outage.py",
    # A software TPM (swtpm) per test, cleared and re-seeded: each tpm2-tools command is a process.
    "tests/integration/test_tpm_swtpm.py",
)
# Not slow enough to leave `make test`, but the longest files there: start them first too.
LONG_FIRST = ("tests/e2e/test_gateways.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = SLOW_FILES + LONG_FIRST

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return order.index(path) if path in order else len(order)

    for item in items:
        if item.nodeid.split("::", 1)[0] in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    items.sort(key=rank)  # stable: every other test keeps its order


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    changed = SANDBOX.changes()
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "the test run wrote outside its temporary directories: " + "; ".join(changed)
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    SANDBOX.leave()

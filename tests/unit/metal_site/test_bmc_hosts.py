"""The site's record of every BMC host it drove (agent/site/bmc_hosts.py), written from several threads at once:
two machines' `bmc.*` commands run side by side through the offload, and each remembers its BMC's host first.
Every host must be kept (a lost one would become a proxy target) and no write may fail on the other's rename.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent.site.bmc_hosts import BmcHosts


def test_hosts_remembered_by_threads_at_once_are_all_kept_on_disk(tmp_path: Path) -> None:
    for round_ in range(20):
        data = tmp_path / f"r{round_}"
        record = BmcHosts(data)
        hosts = [f"10.0.{round_}.{i}" for i in range(12)]
        start = threading.Barrier(len(hosts))

        def remember(host: str, record: BmcHosts = record, start: threading.Barrier = start) -> None:
            start.wait()
            record.remember(host)

        with ThreadPoolExecutor(len(hosts)) as pool:
            for f in [pool.submit(remember, h) for h in hosts]:
                f.result()  # no FileNotFoundError from a rename the other thread made first
        assert record.hosts() == frozenset(hosts)
        assert BmcHosts(data).hosts() == frozenset(hosts)  # what a restarted site reads back

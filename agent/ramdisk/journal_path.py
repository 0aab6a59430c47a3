"""A ramdisk's journal lasts one boot: its file is named by the boot id.

On a real ramdisk the data dir is in memory and goes with the boot anyway; naming the file by boot
makes the rule hold wherever the data dir is (a test's tmp dir, a ramdisk that keeps a scratch disk):
an agent restarted within the boot reopens the same journal and deduplicates as a node does, while
the first start of a new boot makes a new journal with a new `journal_id`, and the control plane
fails what was in flight and not retry-safe `journal-lost` (reference, failure-modes "Journal loss").
Journals of earlier boots are removed: nothing will ever replay them.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "journal-boot-"
_SAFE = re.compile(r"[^0-9A-Za-z-]")


def boot_journal(data_dir: Path, boot_id: str) -> Path:
    """`<data dir>/journal-boot-<boot id>.db`, after removing the journals of other boots (blocking)."""
    name = f"{PREFIX}{_SAFE.sub('', boot_id) or 'unknown'}.db"
    for old in sorted(data_dir.glob(f"{PREFIX}*.db*")):
        if not old.name.startswith(name):
            log.info("event=ramdisk.journal.dropped path=%s", old)
            old.unlink(missing_ok=True)
    return data_dir / name

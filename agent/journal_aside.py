"""A journal that does not open is moved aside, and only the newest few such copies are kept.

A corrupt journal is renamed `journal.db.corrupt-<ms>` (with its `-wal` and
`-shm`), never deleted on the spot: whoever investigates may want it. But a
node whose disk keeps corrupting it (or a crash loop over a bad file) would
otherwise pile copies up until the data dir is full, and a full disk is
what corrupts journals. So each move keeps the newest `KEEP_CORRUPT` copies,
by the time in their names, and deletes the rest. Which to delete is the pure
`to_prune`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from bc.runtime.files import fsync_dir

log = logging.getLogger("agent.journal")

KEEP_CORRUPT = 3
_SIDE_FILES = ("", "-wal", "-shm")


def aside_name(journal_name: str, ms: int) -> str:
    return f"{journal_name}.corrupt-{ms}"


def to_prune(names: Iterable[str], journal_name: str, keep: int = KEEP_CORRUPT) -> list[str]:
    """The names of moved-aside copies (and their side files) beyond the newest `keep`, sorted.

    Names that are not `<journal_name>.corrupt-<ms>[-wal|-shm]` are never chosen.
    """
    pattern = re.compile(re.escape(journal_name) + r"\.corrupt-([0-9]+)(?:-wal|-shm)?")
    by_copy: dict[int, list[str]] = {}
    for name in names:
        m = pattern.fullmatch(name)
        if m is not None:
            by_copy.setdefault(int(m.group(1)), []).append(name)
    old = sorted(by_copy, reverse=True)[max(keep, 0) :]
    return sorted(name for ms in old for name in by_copy[ms])


def move_aside(path: Path, aside: Path, keep: int = KEEP_CORRUPT) -> list[Path]:
    """Rename the journal (and side files) to `aside`, then delete all but the newest `keep` copies. Blocking.

    Returns the files deleted.
    """
    for suffix in _SIDE_FILES:
        p = Path(f"{path}{suffix}")
        if p.exists():
            os.replace(p, Path(f"{aside}{suffix}"))
    fsync_dir(path.parent)  # the corrupt journal stays aside after a power cut, never back in place
    deleted: list[Path] = []
    for name in to_prune((p.name for p in path.parent.iterdir()), path.name, keep):
        old = path.parent / name
        try:
            old.unlink()
        except OSError as e:
            log.warning("event=journal.corrupt-prune-failed path=%s error=%r", old, str(e))
            continue
        deleted.append(old)
    if deleted:
        log.info("event=journal.corrupt-pruned kept=%d deleted=%s", keep, ",".join(p.name for p in deleted))
    return deleted

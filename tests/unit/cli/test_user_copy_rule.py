"""`bc serve`'s rule for the copy in `~/.config/bc`: written when absent or naming its own data dir, never
over another server's or an unreadable file (the processes: tests/e2e/test_user_config_copy.py)."""

from __future__ import annotations

from bc.runtime.config import UserCopy, user_copy


def test_the_copy_is_written_only_over_nothing_or_its_own() -> None:
    assert user_copy(None, "/srv/a") == UserCopy(True, "absent")
    assert user_copy("/srv/a", "/srv/a").write
    assert user_copy("/srv/b", "/srv/a") == UserCopy(False, "names another server's data dir (/srv/b)")
    assert user_copy("", "/srv/a") == UserCopy(False, "names another server's data dir (none)")  # a hand-made config
    assert not user_copy(None, "/srv/a", unreadable=True).write

"""Migration 0020 keys releases by (name, sequence) with their platform: a release stored before it stays, under
the name `bc` with its sequence and an empty platform (signed the old way), and publishing its version again
replaces it at the next sequence, never a reused one."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from bc.control.trust import releases as rel_ctl
from bc.errors import Conflict
from bc.pki import releases
from bc.store import releases as sql
from bc.store.migrate import apply_migrations
from tests.unit.store.conftest import MakeStore

KEY = ed25519.Ed25519PrivateKey.generate()
SHA = "ab" * 32


async def test_old_releases_stay_and_are_published_again_above_them(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for driver in ("bc.store.sqlite", "bc.store.postgres"):
        monkeypatch.setattr(f"{driver}.apply_migrations", partial(apply_migrations, upto=19))
    old = make_store()
    await old.open()
    async with old.transaction() as tx:
        for seq, version in ((1, "1.0.0"), (2, "1.1.0")):
            await tx.execute(  # as 0012 wrote them
                "INSERT INTO releases (sequence, version, sha256, size, signature, key_id, url, published_at_ms)"
                " VALUES (:q, :v, :s, 10, :g, 'k', 'https://m/x', 5)",
                {"q": seq, "v": version, "s": SHA, "g": b"old"},
            )
    await old.close()
    monkeypatch.undo()

    store = make_store()
    await store.open()
    try:
        async with store.transaction() as tx:
            rows = await sql.list_releases(tx)
            assert [(r["name"], r["sequence"], r["version"], r["platform"]) for r in rows] == [
                ("bc", 1, "1.0.0", ""),
                ("bc", 2, "1.1.0", ""),
            ]
            await sql.add_key(tx, releases.key_id(releases.public_bytes(KEY)), releases.public_bytes(KEY), "t", 1)
        assert await rel_ctl.next_sequence(store, "bc") == 3

        async def publish(sequence: int) -> None:
            r = releases.Release("bc", "1.0.0", sequence, "linux-x86_64", SHA, 10)
            header = rel_ctl.ReleaseHeader(
                r.version, r.sha256, r.size, releases.sign(KEY, r), "https://m/y", "bc", sequence, r.platform
            )
            await rel_ctl.publish(
                store, None, header, uploaded=None, uploaded_digest=None, keep_dir=tmp_path, serve_url=""
            )

        with pytest.raises(Conflict, match="sequence 1 is not the next of release name 'bc' \\(3 is\\)"):
            await publish(1)  # its old number: nodes that ran it would take it for a replay
        await publish(3)
        with pytest.raises(Conflict, match="already published"):
            await publish(4)
        async with store.transaction(write=False) as tx:
            rows = await sql.list_releases(tx)
            assert [(r["sequence"], r["version"], r["platform"], r["url"]) for r in rows] == [
                (2, "1.1.0", "", "https://m/x"),
                (3, "1.0.0", "linux-x86_64", "https://m/y"),
            ]
    finally:
        await store.close()

"""`nft`, the only way bc changes or reads the host's firewall (asyncio subprocesses, never blocking the loop).

`load` hands a ruleset to `nft -f -` (one transaction: all of it or nothing, the old tables untouched on
failure); `check=True` adds `-c`, which asks the kernel to validate it without committing. `rule_count` lists
one table as JSON (`nft -j list table …`) and counts its rules: None when the table is gone.
"""

from __future__ import annotations

import asyncio
import json

NFT = "nft"
MAX_ERROR = 300


class NftError(Exception):
    """nft refused or could not run: one line of what it said."""


async def _run(nft: str, *args: str, stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
    try:
        proc = await asyncio.create_subprocess_exec(
            nft,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        raise NftError(f"cannot run {nft}: {e.strerror}") from None
    out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out, err


def _first_error(err: bytes, rc: int) -> str:
    lines = [ln.strip() for ln in err.decode(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln] or lines
    return (errors[0] if errors else f"exit status {rc}")[:MAX_ERROR]


async def load(text: str, *, check: bool = False, nft: str = NFT) -> None:
    """Replace the tables `text` names in one transaction (NftError with nft's first error line)."""
    args = ("-c", "-f", "-") if check else ("-f", "-")
    rc, _, err = await _run(nft, *args, stdin=text.encode())
    if rc != 0:
        raise NftError(f"nft refused the rules: {_first_error(err, rc)}")


async def rule_count(family: str, table: str, *, nft: str = NFT) -> int | None:
    """How many rules the table holds now; None when it does not exist (NftError when nft cannot say)."""
    rc, out, err = await _run(nft, "-j", "list", "table", family, table)
    if rc != 0:
        text = err.decode(errors="replace")
        if "No such file or directory" in text:
            return None
        raise NftError(f"nft cannot list {family} {table}: {_first_error(err, rc)}")
    try:
        doc = json.loads(out)
        return sum(1 for item in doc["nftables"] if "rule" in item)
    except (ValueError, KeyError, TypeError):
        raise NftError(f"nft listed {family} {table} in a form bc cannot read") from None

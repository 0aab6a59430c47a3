"""What the CLI and the TUI both show the same way and that is not terminal output: an instant in UTC, a
size in bytes, a node's volume store."""

from __future__ import annotations

from datetime import UTC, datetime

from bc.protocol.pb import common_pb2


def format_time_ms(at_ms: int) -> str:
    """A wall-clock instant (epoch ms) in UTC, to the second."""
    return datetime.fromtimestamp(at_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def volume_storage_text(v: common_pb2.VolumeStorage) -> str:
    """A node's instance volume store as its last report said (a gauge): `bc instances list` and the TUI's
    node screen (docs/instances.md, "Images and volumes")."""
    return (
        f"volumes: {format_bytes(v.committed_bytes)} promised ({format_bytes(v.outstanding_bytes)} of it not yet"
        f" written) on {format_bytes(v.total_bytes)}, {format_bytes(v.available_bytes)} available,"
        f" {format_bytes(v.reserved_bytes)} kept in reserve"
    )

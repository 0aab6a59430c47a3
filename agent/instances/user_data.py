"""An instance's user data on the host: one 0600 file per instance, on tmpfs, for the runtime to hand the guest.

The `instances` converger gets the value from the secret broker (docs/secrets.md) just before it starts an
instance that names `user_data_secret_ref`, writes it here, and hands the path to the runtime (qemu:
`-fw_cfg name=opt/bc/user-data,file=<path>`). The directory is meant to be on tmpfs (`/run/bc/user-data`,
or the service's `$RUNTIME_DIRECTORY`), so the plaintext never reaches a disk; the file is removed when the
instance stops or is deleted. Nothing here logs the value or its size.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from agent.offload import Offload
from bc.runtime.files import atomic_write


class UserDataFiles:
    def __init__(self, directory: Path, offload: Offload) -> None:
        self.directory = directory
        self.offload = offload

    def path(self, instance_id: str) -> Path:
        return self.directory / instance_id  # an instance id is never a path (bc.protocol.instance_rules)

    async def put(self, instance_id: str, value: bytes) -> Path:
        """Write the value (0600, directory 0700); the path the runtime hands the guest."""
        path = self.path(instance_id)
        await self.offload(atomic_write, path, value, 0o600, dir_mode=0o700)
        return path

    async def drop(self, instance_id: str) -> None:
        """Remove the instance's file, if any."""
        await self.offload(_unlink, self.path(instance_id))


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()

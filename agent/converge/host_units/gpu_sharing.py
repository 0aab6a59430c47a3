"""`gpu-sharing`: how the node's GPUs are shared between the holds of a slot class, time-slicing or MPS.

Settings: `{"mode": "time-slicing", "replicas": 4}` or
`{"mode": "mps", "active_thread_percentage": 25}`.

* `time-slicing`: every GPU in the default compute mode
  (`nvidia-smi -c DEFAULT`), and the NVIDIA device plugin's sharing config,
  `etc/bc/gpu-sharing/device-plugin.yaml` (`sharing.timeSlicing` with the
  replicas), which a Kubernetes node's device plugin is pointed at.
* `mps`: the MPS control daemon as a systemd unit,
  `etc/systemd/system/bc-nvidia-mps.service` (GPUs in `EXCLUSIVE_PROCESS`,
  `nvidia-cuda-mps-control -d`, pipes in `/run/nvidia-mps`, which makes the
  devices converger give slot holds `CUDA_MPS_PIPE_DIRECTORY`), enabled and
  (re)started.

Changing the mode stops what the old one ran; removing the unit stops and
disables the MPS daemon, removes the files and puts the GPUs back in the
default compute mode. A failed step restores the files as they were.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.converge.host_units.base import (
    Applied,
    HostContext,
    Record,
    files_drifted,
    write_then_run,
)
from bc.protocol.host_units import Sharing, parse_sharing

MPS_SERVICE = "bc-nvidia-mps.service"
MPS_UNIT_FILE = f"etc/systemd/system/{MPS_SERVICE}"
PLUGIN_CONFIG = "etc/bc/gpu-sharing/device-plugin.yaml"
MPS_PIPE_DIR = "/run/nvidia-mps"


def mps_unit(pct: int) -> bytes:
    return f"""# Written by bc (host unit gpu-sharing). Do not edit: the next converge pass rewrites it.
[Unit]
Description=NVIDIA MPS control daemon (bc host unit gpu-sharing)
After=nvidia-persistenced.service

[Service]
Type=forking
Environment=CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_DIR}
Environment=CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps
Environment=CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={pct}
RuntimeDirectory=nvidia-mps
LogsDirectory=nvidia-mps
ExecStartPre=/usr/bin/nvidia-smi -c EXCLUSIVE_PROCESS
ExecStart=/usr/bin/nvidia-cuda-mps-control -d
ExecStop=/bin/sh -c 'echo quit | /usr/bin/nvidia-cuda-mps-control'
ExecStopPost=/usr/bin/nvidia-smi -c DEFAULT

[Install]
WantedBy=multi-user.target
""".encode()


def plugin_config(replicas: int) -> bytes:
    return f"""# Written by bc (host unit gpu-sharing). Do not edit: the next converge pass rewrites it.
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: {replicas}
""".encode()


def render(s: Sharing) -> dict[str, bytes]:
    if s.mode == "mps":
        return {MPS_UNIT_FILE: mps_unit(s.active_thread_percentage)}
    return {PLUGIN_CONFIG: plugin_config(s.replicas)}


class GpuSharing:
    name = "gpu-sharing"

    def parse(self, settings: Mapping[str, Any]) -> Sharing:
        return parse_sharing(settings)

    async def check(self, desired: Sharing, ctx: HostContext) -> None:
        return None

    async def drifted(self, desired: Sharing, record: Record, ctx: HostContext) -> bool:
        return await files_drifted(record, ctx.ops)

    async def apply(self, desired: Sharing, record: Record | None, ctx: HostContext) -> Applied:
        files = render(desired)
        had_mps = record is not None and MPS_UNIT_FILE in record.files
        if had_mps and desired.mode != "mps":
            await ctx.ops.command("systemctl", "disable", "--now", MPS_SERVICE)
        if desired.mode == "mps":
            commands = [
                ("systemctl", "daemon-reload"),
                ("systemctl", "enable", MPS_SERVICE),
                ("systemctl", "restart", MPS_SERVICE),
            ]
        else:
            commands = [("systemctl", "daemon-reload")] if had_mps else []
            commands.append(("nvidia-smi", "-c", "DEFAULT"))
        return await write_then_run(ctx.ops, files, record, commands)

    async def remove(self, record: Record, ctx: HostContext) -> None:
        if MPS_UNIT_FILE in record.files:
            await ctx.ops.command("systemctl", "disable", "--now", MPS_SERVICE)
            await ctx.ops.remove(MPS_UNIT_FILE)
            await ctx.ops.command("systemctl", "daemon-reload")
        await ctx.ops.remove(PLUGIN_CONFIG)
        await ctx.ops.command("nvidia-smi", "-c", "DEFAULT")

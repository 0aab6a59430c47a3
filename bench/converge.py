"""Converge pass figures (issue 17) for `make bench`: printed, never asserted.

One agent's convergers as `bc node --fake-hw mig-a100-4` builds them (agent.converge.host_wiring: files
under a host root, commands through the recording fake runner, the fake MIG model; the devices converger
with the fake's device nodes; a thread offload, as in production), over a spec whose `host` and `devices`
sections are non-empty (the `telemetry`, `access` and `daemon` convergers are not in this figure):

* host: sysctl (8 keys), kernel-modules (3), hugepages (2 pools), mig (GPU 2: 3g.40gb + 2 x 2g.20gb)
  and gpu-sharing (mps);
* devices: `--holds` holds (whole GPUs 3 and a MIG instance of GPU 0, then more MIG instances).

`agent.converge.run.run` is timed per pass (wall clock, `time.perf_counter`):

* steady: the same spec again and again, what every 10 s drift pass costs (reads every record, drop-in,
  pool, CDI file and the inventory; writes nothing);
* changing: two specs alternated (sysctl values, the hugepage counts, the MIG layout of GPU 2 and one
  hold differ), so every pass rewrites drop-ins, pools, a MIG layout and a CDI spec.

Usage: python -m bench.converge [--passes 200] [--holds 3]
       python -m bench.run --only converge
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.converge.devices import DevicesConverger
from agent.converge.host_wiring import device_nodes, host_converger
from agent.converge.run import CONVERGED, Converger, run
from agent.hw.fake import FakeHardware
from agent.offload import to_thread
from bc.protocol.pb import spec_pb2
from bench.stats import pct

PROFILE = "mig-a100-4"


def host_section(variant: int) -> spec_pb2.HostSection:
    units: dict[str, Any] = {
        "sysctl": {f"net.core.k{i}": 1000 + i + variant for i in range(8)},
        "kernel-modules": {"modules": ["vfio_pci", "nvidia_peermem", "ib_umad"]},
        "hugepages": {"pages": [{"size": "1G", "count": 16 + variant, "numa_node": 0}, {"size": "2M", "count": 512}]},
        "mig": {"gpus": [{"gpu": 2, "instances": ["3g.40gb", "2g.20gb", "2g.20gb"] if variant == 0 else ["7g.80gb"]}]},
        "gpu-sharing": {"mode": "mps", "active_thread_percentage": 50},
    }
    return spec_pb2.HostSection(
        units=[spec_pb2.HostUnit(name=k, settings_json=json.dumps(v)) for k, v in units.items()]
    )


def devices_section(hw: FakeHardware, holds: int, variant: int) -> spec_pb2.DevicesSection:
    inv = hw.inventory()
    refs = [("gpu", inv.gpus[3].uuid), ("gpu.mig", f"{inv.gpus[0].uuid}/1/0"), ("gpu.mig", f"{inv.gpus[0].uuid}/2/0")]
    refs += [("gpu.mig", f"{inv.gpus[1].uuid}/{gi}/0") for gi in (1, 2, 3)]
    chosen = refs[: max(1, min(holds, len(refs) - 1))]
    if variant:  # the last hold moves to an instance no other hold has
        chosen = [*chosen[:-1], refs[-1]]
    return spec_pb2.DevicesSection(
        assignments=[
            spec_pb2.DeviceAssignment(
                allocation_id=f"a{i}",
                reservation_id=f"r{i}",
                binding=spec_pb2.BINDING_HOLD,
                devices=[spec_pb2.DeviceRef(device_class=c, atom_id=a)],
            )
            for i, (c, a) in enumerate(chosen)
        ]
    )


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "passes": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "p99_ms": round(pct(ms, 0.99), 2),
        "max_ms": round(ms[-1], 2),
    }


async def figures(passes: int, holds: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bc-bench-converge-"))
    try:
        hw = FakeHardware(PROFILE, "bench-node", state_dir=root)
        cdi_dir = root / "cdi"
        convergers: dict[str, Converger] = {
            "host": await host_converger(hw, root, cdi_dir, host_root=None, host_units=True, offload=to_thread),
            "devices": DevicesConverger(
                cdi_dir, root / "env", hw, "bench-node", offload=to_thread, dev_nodes=device_nodes(hw)
            ),
        }
        specs = [spec_pb2.NodeSpec(host=host_section(v), devices=devices_section(hw, holds, v)) for v in (0, 1)]
        out: dict[str, Any] = {"profile": PROFILE, "holds": len(specs[0].devices.assignments), "units": 5}
        for name, pick in (("steady", lambda i: 0), ("changing", lambda i: i % 2)):
            samples: list[float] = []
            outcome = await run(specs[0], 1, convergers)  # warm: the first apply is not a steady pass
            for i in range(passes):
                t0 = time.perf_counter()
                outcome = await run(specs[pick(i + 1)], i + 2, convergers)
                samples.append(time.perf_counter() - t0)
                bad = [s for s in outcome.statuses if s.state != CONVERGED]
                if bad:
                    raise RuntimeError(f"a pass did not converge: {bad[0].section} {bad[0].message}")
            out[name] = summary(samples)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--passes", type=int, default=200)
    ap.add_argument("--holds", type=int, default=3)
    return ap


async def main(args: argparse.Namespace) -> None:
    print("converge pass (host + devices non-empty):", json.dumps(await figures(args.passes, args.holds)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(parser().parse_args()))

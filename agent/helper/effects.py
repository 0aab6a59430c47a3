"""Carrying out a plan as root: files whole or not at all, kernel attributes in place, commands without a shell.

Effects run in order and the first failure stops the rest (an OSError whose
message the server returns, or `Refused` from a check that needs the disk:
the update operations', in `update_effects`). Blocking work goes through the
offload; commands through the runner (`run_process` on a host, `FakeRunner`
under `--fake-commands`). A stream (`kmsg.follow`) is the server's own
(agent.helper.follow), never a plan carried out here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.converge import runtime_config
from agent.converge.host_ops import RunProcess
from agent.converge.kubeadm import REDACTED
from agent.helper import tpm_effects, update_effects, vm_effects, vm_net
from agent.helper.plans import (
    FollowKmsg,
    KubeadmJoin,
    MergeConfig,
    Plan,
    Refused,
    Remove,
    Reply,
    Run,
    TpmCall,
    UpdateInstall,
    UpdateRemember,
    UpdateStage,
    UpdateStep,
    VmLaunch,
    VmRules,
    VmStop,
    VmTaps,
    VmVfio,
    VmVolume,
    Write,
    WriteInPlace,
)
from agent.hw import cdi
from agent.instances.confine import running_vmm_uids
from agent.instances.vfio import VfioHost
from agent.offload import Offload
from agent.tpm import Tpm

COMMAND_TIMEOUT_S = 120.0
JOIN_TIMEOUT_S = 600.0


class EffectFailed(OSError):
    """An effect of a valid request failed (a command exited non-zero, a write failed)."""


async def carry_out(
    plan: Plan,
    *,
    run: RunProcess,
    offload: Offload,
    tpm: Tpm | None = None,
    vfio_host: VfioHost | None = None,
    running_uids: Callable[[], frozenset[int]] = running_vmm_uids,
    rules: vm_net.RootRules | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for effect in plan:
        if isinstance(effect, Write):
            await offload(cdi.atomic_write, effect.path, effect.data, effect.mode)
        elif isinstance(effect, WriteInPlace):
            await offload(_write_in_place, effect)
        elif isinstance(effect, Remove):
            result["removed"] = await offload(cdi.remove_file, effect.path)
        elif isinstance(effect, Run):
            res = await run(list(effect.argv), timeout_s=effect.timeout_s or COMMAND_TIMEOUT_S)
            if res.returncode != 0:
                raise EffectFailed(f"{' '.join(effect.argv)} exited {res.returncode}: {res.tail(300)}")
        elif isinstance(effect, MergeConfig):
            result["changed"] = await offload(_merge, effect)
        elif isinstance(effect, KubeadmJoin):
            await _join(effect, run=run, offload=offload)
        elif isinstance(effect, Reply):
            result.update(effect.value)
        elif isinstance(effect, UpdateStage | UpdateInstall | UpdateStep | UpdateRemember):
            result.update(await offload(update_effects.carry, effect))
        elif isinstance(effect, TpmCall):
            if tpm is None:
                raise EffectFailed("this helper has no TPM")
            result.update(await tpm_effects.carry(effect, tpm))
        elif isinstance(effect, VmVfio):
            if vfio_host is None:
                raise EffectFailed("this helper has no VFIO host")
            result.update(await offload(vm_effects.carry, effect, vfio_host, running_uids))
        elif isinstance(effect, VmLaunch):
            if vfio_host is None:
                raise EffectFailed("this helper has no VFIO host")
            result.update(await vm_effects.launch(effect, vfio_host, running_uids, offload))
        elif isinstance(effect, VmStop):
            if vfio_host is None:
                raise EffectFailed("this helper has no VFIO host")
            result.update(await vm_effects.stop(effect, vfio_host, running_uids, offload))
        elif isinstance(effect, VmVolume):
            result.update(await offload(vm_effects.carry_volume, effect, running_uids))
        elif isinstance(effect, VmTaps | VmRules):
            if rules is None:
                raise EffectFailed("this helper loads no instance network rules")
            if isinstance(effect, VmTaps):
                result.update(await vm_net.carry_taps(effect, rules, offload))
            else:
                result.update(await vm_net.rules(effect, rules, offload))
        elif isinstance(effect, FollowKmsg):
            raise EffectFailed("kmsg.follow is a stream, not an operation with one reply")
    return result


def _merge(effect: MergeConfig) -> bool:
    try:
        text: str | None = effect.path.read_text("utf-8", "replace")
    except FileNotFoundError:
        text = None
    new = runtime_config.merged(effect.kind, text, effect.cdi_dirs, effect.present)
    if new == text:
        return False
    if new is None:
        cdi.remove_file(effect.path)
    else:
        cdi.atomic_write(effect.path, new.encode(), 0o644)
    return True


def _cluster_listed(effect: KubeadmJoin) -> bool:
    try:
        lines = effect.clusters.read_text("utf-8").splitlines()
    except FileNotFoundError:
        return False
    listed = {tuple(line.split()[:2]) for line in lines if len(line.split()) >= 2 and not line.startswith("#")}
    return all((effect.api_server, h) in listed for h in effect.ca_cert_hashes)


async def _join(effect: KubeadmJoin, *, run: RunProcess, offload: Offload) -> None:
    if not await offload(_cluster_listed, effect):
        raise Refused(
            f"the cluster at {effect.api_server} with these CA hashes is not in {effect.clusters};"
            " the helper joins only the clusters root listed there"
        )
    try:
        await offload(cdi.atomic_write, effect.config, effect.data, 0o600)
        res = await run(list(effect.argv), timeout_s=JOIN_TIMEOUT_S)
        if res.returncode != 0:
            raise EffectFailed(_redact(f"{' '.join(effect.argv)} exited {res.returncode}: {res.tail(300)}", effect))
    except OSError as e:
        raise EffectFailed(_redact(str(e), effect)) from None
    finally:
        await offload(cdi.remove_file, effect.config)


def _redact(text: str, effect: KubeadmJoin) -> str:
    for secret in effect.secrets:
        text = text.replace(secret, REDACTED)
    return text


def _write_in_place(effect: WriteInPlace) -> None:
    with effect.path.open("w", encoding="ascii") as f:
        f.write(effect.text)

"""An operator sets a host or daemon change that runs code as root: refused, each class of it.

A `kernel.core_pattern` pipe, `kernel.modprobe` and the other keys that name
a program the kernel runs or widen its attack surface, a sysctl key outside
the operator's allowlist, a kernel module to load, a host unit bc does not
know, one that installs packages or a driver or joins a Kubernetes cluster,
a daemon release: each is
root-equivalent (bc.protocol.root_equiv) and needs the admin role. The
operator's call is refused with the reason and nothing is stored (a rollout
job that would patch it fails at its node's step, before any write); the
settings an operator may make (network and VM tuning, huge pages, a core
pattern that is a file) still go through.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from bc.errors import Unauthenticated
from bc.protocol.pb import admin_pb2
from tests.integration import conftest as lab_fixtures
from tests.integration.conftest import InprocLab
from tests.integration.operators_lab import add_operator, as_operator
from tests.security.rootequiv_helpers import generation, host

lab, store_url = lab_fixtures.lab, lab_fixtures.store_url  # the in-process lab, on each store

ROOT_SYSCTLS = {
    "kernel.core_pattern": "|/tmp/x %p",
    "kernel.modprobe": "/tmp/x",
    "kernel.hotplug": "/tmp/x",
    "kernel.poweroff_cmd": "/tmp/x",
    "kernel.usermodehelper.bset": "4294967295 4294967295",
    "fs.binfmt_misc.register": ":x:E::x::/tmp/x:",
    "kernel.kexec_load_disabled": 0,
    "kernel.unprivileged_bpf_disabled": 0,
    "kernel.yama.ptrace_scope": 0,
    "kernel.kptr_restrict": 0,
    "kernel.dmesg_restrict": 0,
    "kernel.sysrq": 1,
    "vm.mmap_min_addr": 0,
    "kernel.randomize_va_space": 0,  # not on the operator's allowlist
}

REFUSED = {
    **{f"sysctl {k}": ("host", host({"sysctl": {k: v}})) for k, v in ROOT_SYSCTLS.items()},
    "kernel-modules": ("host", host({"kernel-modules": {"modules": ["evil"]}})),
    "an unknown unit": ("host", host({"infiniband": {"mode": "ipoib"}})),
    "nvidia-driver": ("host", host({"nvidia-driver": {"branch": "550"}})),
    "fabric-manager": ("host", host({"fabric-manager": {"version": "550.127.05"}})),
    "container-toolkit": ("host", host({"container-toolkit": {"runtimes": ["containerd"]}})),
    "kubernetes": (
        "host",
        host(
            {
                "kubernetes": {
                    "api_server": "10.0.0.1:6443",
                    "token": "abcdef.0123456789abcdef",
                    "ca_cert_hashes": ["sha256:" + "ab" * 32],
                }
            }
        ),
    ),
    "daemon": ("daemon", json.dumps({"version": "9.9.9", "url": "https://evil.example/bc", "sha256": "ab" * 32})),
}

ALLOWED = {
    "network and VM tuning": ("host", host({"sysctl": {"net.core.somaxconn": 4096, "vm.max_map_count": 262144}})),
    "a core pattern that is a file": ("host", host({"sysctl": {"kernel.core_pattern": "/var/crash/core.%p"}})),
    "huge pages": ("host", host({"hugepages": {"pages": [{"size": "2M", "count": 64}]}})),
}


async def test_an_operator_cannot_make_a_node_run_code_as_root(lab: InprocLab) -> None:
    # Every class on one lab (a lab per class was 42 labs and 7 minutes of a worker): each refusal is its
    # own call, checked on its own, and the spec after each is the spec before it.
    await lab.join("n1")
    bob = await add_operator(lab, "bob", "operator")
    for what in sorted(REFUSED):
        before = await lab.admin.get_spec("n1")
        section, text = REFUSED[what]
        with pytest.raises(Unauthenticated, match=r"root-equivalent .*needs the admin role.*operator bob"):
            await as_operator(bob, lambda c, s=section, t=text: c.set_spec_section("n1", s, t))
        after = await lab.admin.get_spec("n1")
        assert (after.generation, after.spec_json) == (before.generation, before.spec_json), what


async def test_what_an_operator_may_set_still_goes_through(lab: InprocLab) -> None:
    await lab.join("n1")
    bob = await add_operator(lab, "bob", "operator")
    for section, text in ALLOWED.values():
        gen = await generation(lab)
        await as_operator(bob, lambda c, s=section, t=text: c.set_spec_section("n1", s, t))
        assert await generation(lab) == gen + 1
    # Taking a module off the list, or a unit away, widens nothing either (the admin set them first).
    await lab.admin.set_spec_section("n1", "host", host({"kernel-modules": {"modules": ["vfio_pci", "nvme"]}}))
    gen = await generation(lab)
    fewer = host({"kernel-modules": {"modules": ["nvme"]}})
    await as_operator(bob, lambda c: c.set_spec_section("n1", "host", fewer))
    assert await generation(lab) == gen + 1


async def final(lab: InprocLab, dag_id: str) -> admin_pb2.JobInfo:
    last = None
    async with asyncio.timeout(30):
        async for info in lab.admin.watch_job(dag_id):
            last = info
    assert last is not None and last.terminal, last
    return last


async def test_an_operators_rollout_cannot_carry_a_root_equivalent_patch(lab: InprocLab) -> None:
    await lab.join("n1")
    bob = await add_operator(lab, "bob", "operator")
    gen = await generation(lab)
    section, text = REFUSED["sysctl kernel.core_pattern"]
    req = admin_pb2.SubmitJobRequest(template="rollout", nodes=["n1"], section=section, section_json=text)
    job = await as_operator(bob, lambda c: c.submit_job(req))
    done = await final(lab, job.id)
    assert done.state == "failed" and "root-equivalent" in done.first_error and "admin" in done.first_error
    assert await generation(lab) == gen

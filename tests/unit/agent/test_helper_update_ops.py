"""agent.helper.update_ops and agent.helper.kmsg: the self-update and XID operations' pure checks.

The helper verifies a release again itself before it places it: examples show
each refusal (a signature under no root it trusts, a key no root endorsed,
staged bytes that are not the release's, a release the swap rules refuse), and
Hypothesis shows that no altered release, no signer outside root's list and no
sequence of steps gets `current` onto a binary the helper did not verify.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.helper import kmsg, ops, update_ops
from agent.helper.ops import FollowKmsg, Layout, Refused, UpdateInstall, UpdateRemember, UpdateStage, UpdateStep
from agent.upgrade import swap_rules as sr
from bc.pki import releases

LAY = Layout(Path("/h"))
HERE = "linux-x86_64"
ROOT_KEY = ed25519.Ed25519PrivateKey.generate()
ROOT = releases.public_bytes(ROOT_KEY)
ENDORSED_KEY = ed25519.Ed25519PrivateKey.generate()
ENDORSED = (releases.public_bytes(ENDORSED_KEY), releases.endorse(ROOT_KEY, releases.public_bytes(ENDORSED_KEY)))
STRAY_KEY = ed25519.Ed25519PrivateKey.generate()
BINARY = b"#!/bin/sh\necho 'bc 1.1.0'\n"
DIGEST = (hashlib.sha256(BINARY).hexdigest(), len(BINARY))


def req(op: str, **args: Any) -> dict[str, Any]:
    return {"v": ops.VERSION, "op": op, **args}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def release(version: str = "1.1.0", sequence: int = 1, **over: Any) -> releases.Release:
    fields: dict[str, Any] = {"name": "bc", "version": version, "sequence": sequence, "platform": HERE}
    fields |= {"sha256": DIGEST[0], "size": DIGEST[1], **over}
    return releases.Release(**fields)


def first_install(**record: Any) -> sr.Disk:
    """`bc.a` running 1.0.0 as a package left it (sequence 0), a download staged for `b`."""
    return sr.Disk("a", frozenset({"a"}), True, sr.Record(slots={"a": sr.Installed("1.0.0", 0)}, **record))


def install(disk: sr.Disk, rel: releases.Release, signer: ed25519.Ed25519PrivateKey = ROOT_KEY, **kw: Any) -> sr.Disk:
    args: dict[str, Any] = {"keys": [ENDORSED], "roots": [ROOT], "staged": DIGEST} | kw
    new, _key = update_ops.check_install(
        disk, rel, releases.sign(signer, rel), args["keys"], args["roots"], args["staged"], HERE, "1.0.0"
    )
    return new


# -- update.install


def test_a_release_signed_by_a_root_or_a_key_it_endorsed_is_placed_in_the_other_slot() -> None:
    for signer in (ROOT_KEY, ENDORSED_KEY):
        disk = install(first_install(), release(), signer)
        assert disk.slots == {"a", "b"} and not disk.partial and disk.current == "a"
        assert disk.record.slots["b"] == sr.Installed("1.1.0", 1, "bc")
        assert disk.record.state == "idle"  # placed, nothing armed: `current` still names `a`


def test_a_key_no_root_endorsed_or_one_a_stray_key_endorsed_signs_nothing_here() -> None:
    unendorsed = (releases.public_bytes(STRAY_KEY), b"")
    by_stray = (releases.public_bytes(STRAY_KEY), releases.endorse(ENDORSED_KEY, releases.public_bytes(STRAY_KEY)))
    for keys in ([unendorsed], [by_stray], [ENDORSED, by_stray]):
        with pytest.raises(Refused, match="does not verify under the helper's release roots"):
            install(first_install(), release(), STRAY_KEY, keys=keys)
    with pytest.raises(Refused, match="does not verify"):  # the agent's bundle is worth nothing without a root
        install(first_install(), release(), ENDORSED_KEY, roots=[releases.public_bytes(STRAY_KEY)])


def test_staged_bytes_that_are_not_the_releases_are_refused() -> None:
    with pytest.raises(Refused, match=r"the staged file is 5 bytes with sha256 .*not the release's"):
        install(first_install(), release(), staged=(hashlib.sha256(b"other").hexdigest(), 5))
    with pytest.raises(Refused, match="nothing is staged"):
        install(first_install(), release(), staged=None)


def test_the_swap_rules_hold_as_root_too() -> None:
    running = replace(first_install(), record=sr.Record(slots={"a": sr.Installed("1.3.0", 3, "bc")}, floor=3))
    with pytest.raises(Refused, match=r"not newer than the sequence 3 .*\(not-newer\)"):
        install(running, release(sequence=3))
    with pytest.raises(Refused, match=r"\(wrong-platform\)"):
        install(first_install(), release(platform="linux-aarch64"))
    with pytest.raises(Refused, match=r"\(failed-before\)"):
        install(replace(first_install(), record=replace(first_install().record, failed_versions=("1.1.0",))), release())
    pending = first_install(state="pending", version="1.2.0")
    with pytest.raises(Refused, match=r"still unconfirmed"):
        install(pending, release())


signed_fields = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["bc", "bc-tools"]),
        "version": st.sampled_from(["1.1.0", "1.1.1", "2.0.0-rc1"]),
        "sequence": st.integers(1, 5),
        "platform": st.sampled_from([HERE, "linux-aarch64"]),
        "sha256": st.sampled_from([DIGEST[0], hashlib.sha256(b"x").hexdigest()]),
        "size": st.sampled_from([DIGEST[1], DIGEST[1] + 1]),
    }
)


@given(signed=signed_fields, sent=signed_fields, signer=st.sampled_from(["root", "endorsed", "stray"]))
@settings(max_examples=400, deadline=None)
def test_a_release_is_placed_only_as_signed_under_a_root_and_staged_byte_for_byte(
    signed: dict[str, Any], sent: dict[str, Any], signer: str
) -> None:
    key = {"root": ROOT_KEY, "endorsed": ENDORSED_KEY, "stray": STRAY_KEY}[signer]
    signature = releases.sign(key, releases.Release(**signed))
    try:
        disk, _ = update_ops.check_install(
            first_install(), releases.Release(**sent), signature, [ENDORSED], [ROOT], DIGEST, HERE, "1.0.0"
        )
    except Refused:
        return
    assert signer != "stray" and sent == signed
    assert (sent["sha256"], sent["size"], sent["platform"]) == (*DIGEST, HERE)
    assert disk.record.slots["b"] == sr.Installed(sent["version"], sent["sequence"], sent["name"])


def test_the_install_request_is_checked_before_anything_is_read() -> None:
    rel = release()
    good = {
        "name": rel.name,
        "version": rel.version,
        "sequence": rel.sequence,
        "platform": rel.platform,
        "sha256": rel.sha256,
        "size": rel.size,
        "signature": b64(releases.sign(ROOT_KEY, rel)),
        "keys": [{"public_key": b64(ENDORSED[0]), "root_signature": b64(ENDORSED[1])}],
        "running_version": "1.0.0",
    }
    (effect,) = ops.plan(req("update.install", **good), LAY)
    assert effect == UpdateInstall(
        LAY.install_dir, LAY.release_roots, rel, releases.sign(ROOT_KEY, rel), (ENDORSED,), "1.0.0"
    )
    for bad, match in (
        ({"signature": "!!"}, "not base64"),
        ({"signature": b64(b"x" * 63)}, "63 bytes, not 64"),
        ({"sha256": "A" * 64}, "64 lowercase hex"),
        ({"version": "1.0\nsequence=9"}, "not a release version"),
        ({"keys": [{"public_key": b64(b"k" * 31), "root_signature": ""}]}, "31 bytes, not 32"),
        ({"keys": [{"public_key": b64(ROOT)}]}, "public_key, root_signature"),
        ({"running_version": "../x"}, "running_version"),
    ):
        with pytest.raises(Refused, match=match):
            ops.plan(req("update.install", **(good | bad)), LAY)
    with pytest.raises(Refused, match="takes no path"):
        ops.plan(req("update.install", **good, path="/usr/bin/sudo"), LAY)


def test_root_lists_its_release_roots_as_ed25519_public_keys() -> None:
    pem = ROOT_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert update_ops.parse_roots(b"# the fleet's root\n" + pem + b"\n" + pem) == [ROOT, ROOT]
    rsa_pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=1024)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(Refused, match="not an Ed25519 key"):
        update_ops.parse_roots(rsa_pem)
    with pytest.raises(Refused, match="no Ed25519 PUBLIC KEY"):
        update_ops.parse_roots(b"ssh-ed25519 AAAA root\n")


# -- update.stage, update.step, update.remember


def test_a_chunk_is_staged_in_order_and_never_while_a_swap_is_unconfirmed() -> None:
    assert ops.plan(req("update.stage", offset=0, data=b64(b"abc")), LAY) == (UpdateStage(LAY.install_dir, 0, b"abc"),)
    update_ops.check_stage(first_install(), 0, None)
    update_ops.check_stage(first_install(), 3, 3)
    with pytest.raises(Refused, match="offset 5 is not the staged file's size"):
        update_ops.check_stage(first_install(), 5, 3)
    with pytest.raises(Refused, match="still unconfirmed"):
        update_ops.check_stage(first_install(state="pending", version="1.2.0"), 0, None)
    for bad in ({"offset": -1, "data": ""}, {"offset": 0, "data": "a" * (3 << 20)}, {"offset": 0, "data": "%%%"}):
        with pytest.raises(Refused):
            ops.plan(req("update.stage", **bad), LAY)


def test_arm_arms_the_slot_the_helper_placed_never_a_release_the_request_names() -> None:
    placed = install(first_install(), release())
    assert ops.plan(req("update.step", step="arm", command_id="01HX", deadline=100.5), LAY) == (
        UpdateStep(LAY.install_dir, sr.Step.ARM, "01HX", 100.5),
    )
    armed = update_ops.check_step(placed, sr.Step.ARM, "01HX", 100.5, HERE)
    assert (armed.record.state, armed.record.version, armed.record.sequence) == ("pending", "1.1.0", 1)
    switched = update_ops.check_step(armed, sr.Step.SWITCH, "", 0, HERE)
    assert switched.current == "b"
    with pytest.raises(Refused, match="can't switch in state idle"):
        update_ops.check_step(placed, sr.Step.SWITCH, "", 0, HERE)
    with pytest.raises(Refused, match="slot b holds no release the helper installed"):
        update_ops.check_step(first_install(), sr.Step.ARM, "", 0, HERE)


def test_arm_refuses_the_older_release_a_confirmed_swap_left_in_the_other_slot() -> None:
    disk = install(first_install(), release())
    for step in (sr.Step.ARM, sr.Step.SWITCH, sr.Step.CONFIRM):
        disk = update_ops.check_step(disk, step, "", 1.0, HERE)
    disk = replace(disk, record=replace(disk.record, slots={**disk.record.slots, "a": sr.Installed("0.9", 1, "bc")}))
    with pytest.raises(Refused, match=r"slot a: .*\(not-newer\)"):
        update_ops.check_step(disk, sr.Step.ARM, "", 1.0, HERE)


@pytest.mark.parametrize(
    "args",
    [
        {"step": "place"},
        {"step": "stage"},
        {"step": "restart"},
        {"step": "arm", "command_id": "x"},
        {"step": "arm", "command_id": "a b", "deadline": 1},
        {"step": "arm", "command_id": "x", "deadline": True},
        {"step": "switch", "deadline": 1},
    ],
)
def test_a_step_outside_the_table_or_with_arguments_it_does_not_take_is_refused(args: dict[str, Any]) -> None:
    with pytest.raises(Refused):
        ops.plan(req("update.step", **args), LAY)


def test_the_refusal_memory_is_one_release_or_none() -> None:
    refused = {"name": "bc", "sequence": 2, "version": "1.2.0", "reason": "helper-refused", "message": "no."}
    assert ops.plan(req("update.remember", refused=refused), LAY) == (
        UpdateRemember(LAY.install_dir, sr.Refused("bc", 2, "1.2.0", "helper-refused", "no.")),
    )
    assert ops.plan(req("update.remember", refused=None), LAY) == (UpdateRemember(LAY.install_dir, None),)
    for bad in ({**refused, "message": "a\nb"}, {**refused, "extra": 1}, {**refused, "name": "../x"}, 7):
        with pytest.raises(Refused):
            ops.plan(req("update.remember", refused=bad), LAY)
    with pytest.raises(Refused):
        ops.plan(req("update.remember"), LAY)


@given(st.lists(st.sampled_from(sorted(update_ops.STEPS)), max_size=12), st.booleans())
@settings(max_examples=600, deadline=None)
def test_no_sequence_of_steps_puts_current_on_a_binary_the_helper_did_not_verify(
    steps: list[str], placed: bool
) -> None:
    disk = install(first_install(), release()) if placed else replace(first_install(), partial=False)
    for name in steps:
        try:
            disk = update_ops.check_step(disk, update_ops.STEPS[name], "c", 10.0, HERE)
        except Refused:
            continue
        assert sr.runnable(disk)
        if disk.current == "b":  # off the slot the package installed: only onto what update.install placed
            assert placed and disk.record.slots["b"] == sr.Installed("1.1.0", 1, "bc")


# -- kmsg.follow


def test_xid_records_cross_parsed_rebuilt_and_bounded() -> None:
    line = "4,1523,7234567890,-;NVRM: Xid (PCI:0000:3B:00): 79, pid=1234, GPU has fallen off the bus."
    assert kmsg.xid_record(line) == {
        "seq": 1523,
        "pci": "0000:3b:00",
        "xid": 79,
        "text": "pid=1234, GPU has fallen off the bus.",
        "uptime_s": 7234.568,
    }
    plain = kmsg.xid_record("[  12.5] NVRM: Xid (PCI:0000:3a:00.0): 63, Row remapping event\x1b[31m " + "x" * 500)
    assert plain is not None and plain["seq"] is None and plain["xid"] == 63
    assert len(plain["text"]) == kmsg.MAX_TEXT and "\x1b" not in plain["text"]
    assert kmsg.xid_record("6,1,2,-;usb 1-1: new high-speed USB device") is None
    assert kmsg.xid_record("6,1,2,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module") is None
    assert ops.plan(req("kmsg.follow", after_seq=-1), LAY) == (FollowKmsg(LAY.root / "dev/kmsg", -1),)
    with pytest.raises(Refused, match="after_seq"):
        ops.plan(req("kmsg.follow", after_seq="0; cat /etc/shadow"), LAY)
    with pytest.raises(Refused, match="takes no path"):
        ops.plan(req("kmsg.follow", after_seq=0, path="/var/log/auth.log"), LAY)


@given(st.text(max_size=300))
@settings(max_examples=800, deadline=None)
def test_any_kernel_line_becomes_nothing_or_an_xid_of_bounded_printable_fields(line: str) -> None:
    record = kmsg.xid_record(line)
    if record is None:
        return
    assert set(record) <= {"seq", "pci", "xid", "text", "uptime_s"}
    assert re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}", record["pci"])
    assert 0 <= record["xid"] <= 999_999 and len(record["text"]) <= kmsg.MAX_TEXT
    assert all(" " <= c <= "~" for c in record["text"])


@given(st.text(max_size=60).map(lambda t: f"2,{len(t)},1000,-;NVRM: Xid (PCI:0000:01:00): 13, {t}"))
@settings(max_examples=300, deadline=None)
def test_every_xid_line_of_the_drivers_format_is_read_and_after_seq_drops_what_the_agent_has(line: str) -> None:
    record = kmsg.xid_record(line)
    assert record is not None and record["pci"] == "0000:01:00" and record["xid"] == 13
    assert kmsg.wanted(record, record["seq"] - 1) and not kmsg.wanted(record, record["seq"])

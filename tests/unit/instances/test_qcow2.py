"""agent.instances.qcow2 against real headers written by `qemu-img create`, and crafted bad ones."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from agent.instances import qcow2


def img(tmp: Path, name: str, *args: str, size: str = "64M") -> Path:
    path = tmp / name
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", *args, str(path), size], check=True)
    return path


def head(path: Path) -> tuple[bytes, int]:
    return qcow2.read_head(path)


@pytest.mark.parametrize("compat", ["1.1", "0.10"])
def test_a_plain_qcow2_passes_with_its_size(tmp_path: Path, compat: str) -> None:
    h = qcow2.check_base(*head(img(tmp_path, "b.qcow2", "-o", f"compat={compat}")))
    assert (h.version, h.size) == ((3 if compat == "1.1" else 2), 64 << 20)


def test_a_backing_file_is_refused_and_an_overlay_must_name_its_own(tmp_path: Path) -> None:
    base = img(tmp_path, "base.qcow2")
    ov = img(tmp_path, "ov.qcow2", "-u", "-b", str(base), "-F", "qcow2")
    with pytest.raises(qcow2.Qcow2Refused, match=r"^names a backing file$"):
        qcow2.check_base(*head(ov))
    assert qcow2.check_overlay(*head(ov), base, "qcow2").backing_file == str(base)
    with pytest.raises(qcow2.Qcow2Refused, match=r"names the backing file '.*base.qcow2' \(qcow2\), not its base"):
        qcow2.check_overlay(*head(ov), tmp_path / "other.qcow2", "qcow2")
    with pytest.raises(qcow2.Qcow2Refused, match="not its base image"):
        qcow2.check_overlay(*head(ov), base, "raw")


def test_an_external_data_file_is_refused(tmp_path: Path) -> None:
    raw = tmp_path / "d.raw"
    raw.write_bytes(b"")
    path = img(tmp_path, "df.qcow2", "-o", f"data_file={raw}", size="1M")
    with pytest.raises(qcow2.Qcow2Refused, match=r"^names an external data file$"):
        qcow2.check_base(*head(path))


def test_an_encrypted_image_is_refused(tmp_path: Path) -> None:
    # qemu-img's own encrypted image, in the legacy AES format: a LUKS one costs seconds of key derivation
    # (it flaked on a loaded host); a LUKS header's method (2) is among the crafted cases below.
    path = img(
        tmp_path,
        "enc.qcow2",
        "--object",
        "secret,id=s0,data=abc",
        "-o",
        "encrypt.format=aes,encrypt.key-secret=s0",
        size="1M",
    )
    with pytest.raises(qcow2.Qcow2Refused, match=r"^is encrypted$"):
        qcow2.check_base(*head(path))


def patched(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


def test_crafted_headers_are_refused(tmp_path: Path) -> None:
    data, size = head(img(tmp_path, "b.qcow2"))
    cases = [
        (b"not a qcow2 at all" * 10, "is not a qcow2 image"),
        (data[:50], "has a truncated qcow2 header"),
        (patched(data, 4, ">I", 4), "is a qcow2 of version 4, not 2 or 3"),
        (patched(data, 20, ">I", 30), "malformed qcow2 header"),
        (patched(data, 72, ">Q", qcow2.INCOMPAT_DATA_FILE), "names an external data file"),
        (patched(data, 72, ">Q", 1 << 9), "sets incompatible qcow2 feature bits bc does not know (0x200)"),
        (patched(data, 72, ">Q", qcow2.INCOMPAT_CORRUPT), "is marked corrupt"),
        (patched(data, 32, ">I", 1), "is encrypted"),
        (patched(data, 32, ">I", 2), "is encrypted"),
        (patched(data, 100, ">I", 101), "malformed qcow2 header"),
        (patched(patched(data, 8, ">Q", 1 << 20), 16, ">I", 10), "names a backing file outside its header"),
    ]
    for bad, words in cases:
        with pytest.raises(qcow2.Qcow2Refused, match=words.replace("(", r"\(").replace(")", r"\)")):
            qcow2.check_base(bad, max(size, len(bad)))
    with pytest.raises(qcow2.Qcow2Refused, match="is truncated: its tables lie past the end of the file"):
        qcow2.check_base(data[:1000], 1000)


def test_a_data_file_extension_alone_is_refused(tmp_path: Path) -> None:
    data, size = head(img(tmp_path, "b.qcow2"))
    header_len = struct.unpack_from(">I", data, 100)[0]
    ext = struct.pack(">II", qcow2.EXT_DATA_FILE, 8) + b"/dev/sda" + struct.pack(">II", 0, 0)
    crafted = data[:header_len] + ext + data[header_len + len(ext) :]
    with pytest.raises(qcow2.Qcow2Refused, match=r"^names an external data file$"):
        qcow2.check_base(crafted, size)


def test_a_symlink_is_never_followed(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(img(tmp_path, "b.qcow2"))
    with pytest.raises(OSError):
        qcow2.read_head(tmp_path / "link")

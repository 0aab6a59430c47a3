"""`bc unit print serve|node`: hardened units systemd accepts; `bc --version` / `bc version`: what a build is."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bc.cli.main import cli
from bc.runtime import version as bc_version_module

Unit = dict[str, dict[str, list[str]]]


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def parse_unit(text: str) -> Unit:
    """section → key → values (a key may repeat); fails on anything that is not a comment, section or key=value."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], defaultdict(list))
            continue
        key, sep, value = line.partition("=")
        assert sep and section is not None and key == key.strip(), f"line {n} is not key=value in a section: {line!r}"
        section[key].append(value)
    return unit


def printed(*args: str) -> Unit:
    result = run("unit", "print", *args)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return parse_unit(result.stdout)


def one(unit: Unit, key: str, section: str = "Service") -> str:
    values = unit[section].get(key, [])
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def writable(unit: Unit) -> set[str]:
    return {p.lstrip("-") for v in unit["Service"]["ReadWritePaths"] for p in v.split()}


# -- the server -----------------------------------------------------------------------------


def test_serve_unit_is_sandboxed_and_restarts_on_failure() -> None:
    unit = printed("serve")
    assert one(unit, "ExecStart") == "/usr/local/bin/bc serve --data-dir /var/lib/bc --listen 0.0.0.0:7443"
    assert one(unit, "Restart") == "on-failure"
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "",
        "StateDirectory": "bc",
        "StateDirectoryMode": "0700",
    }.items():
        assert one(unit, key) == value, key
    assert writable(unit) == {"/var/lib/bc"}
    assert one(unit, "WantedBy", "Install") == "multi-user.target"


def test_serve_unit_with_a_data_dir_outside_var_lib_and_advertised_names() -> None:
    unit = printed("serve", "--data-dir", "/srv/bc", "--listen", "10.0.0.5:7443", "--advertise", "ctl.lab")
    assert one(unit, "ExecStart") == (
        "/usr/local/bin/bc serve --data-dir /srv/bc --listen 10.0.0.5:7443 --advertise ctl.lab"
    )
    assert writable(unit) == {"/srv/bc"}
    assert "StateDirectory" not in unit["Service"], "systemd can only create state directories under /var/lib"
    assert one(unit, "Environment") == "HOME=/srv/bc"


# -- the agent ------------------------------------------------------------------------------


def test_node_unit_always_restarts_and_can_do_its_work() -> None:
    unit = printed("node", "--as-root", "--allow-reboot", "--allow-gpu-reset", "--bin", "/opt/bc/bc")
    assert one(unit, "ExecStart") == (
        "/opt/bc/bc node --data-dir /var/lib/bc-node --cdi-dir /etc/cdi --env-dir /run/bc/allocations"
        " --allow-reboot --allow-gpu-reset"
    )
    assert one(unit, "Restart") == "always"
    assert one(unit, "RestartSec") == "5"
    assert one(unit, "StartLimitIntervalSec", "Unit") == "0"
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert one(unit, key) == "yes", key
    assert one(unit, "ProtectSystem") == "strict"
    host = {"/etc/sysctl.d", "/etc/modules-load.d", "/etc/systemd/system", "/etc/bc"}  # the host units' files
    assert writable(unit) == {"/var/lib/bc-node", "/etc/cdi", "/run/bc/allocations", *host}
    assert unit["Service"]["ConfigurationDirectory"] == ["cdi", "bc"]
    assert one(unit, "RuntimeDirectory") == "bc/allocations"
    assert one(unit, "RuntimeDirectoryPreserve") == "yes"
    # What would stop the agent from reading GPUs and XIDs, resetting a GPU or rebooting the host.
    for key in ("PrivateDevices", "ProtectKernelLogs", "ProtectClock", "CapabilityBoundingSet", "SystemCallFilter"):
        assert key not in unit["Service"], key


def test_node_unit_carries_the_upload_allowlist() -> None:
    unit = printed(
        "node", "--as-root", "--upload-allow", "https://logs.example/bc/", "--upload-allow", "http://[::1]:8080/up"
    )
    assert one(unit, "ExecStart") == (
        "/usr/local/bin/bc node --data-dir /var/lib/bc-node --cdi-dir /etc/cdi --env-dir /run/bc/allocations"
        " --upload-allow https://logs.example/bc/ --upload-allow http://[::1]:8080/up"
    )
    assert "--upload-allow" not in one(printed("node", "--as-root"), "ExecStart")  # none unless the operator names one


def test_node_unit_with_no_host_units_opens_none_of_their_paths() -> None:
    unit = printed("node", "--as-root", "--no-host-units")
    assert one(unit, "ExecStart").endswith(" --no-host-units")
    assert writable(unit) == {"/var/lib/bc-node", "/etc/cdi", "/run/bc/allocations"}
    assert one(unit, "ConfigurationDirectory") == "cdi"


def test_node_unit_with_cdi_in_var_run() -> None:
    unit = printed("node", "--as-root", "--cdi-dir", "/var/run/cdi", "--no-host-units")
    assert writable(unit) == {"/var/lib/bc-node", "/var/run/cdi", "/run/bc/allocations"}
    assert unit["Service"]["RuntimeDirectory"] == ["cdi", "bc/allocations"]
    assert "ConfigurationDirectory" not in unit["Service"]


def test_the_default_node_unit_is_unprivileged_beside_the_helper() -> None:
    unit = printed("node", "--allow-gpu-reset", "--bin", "/opt/bc/bc")
    assert one(unit, "ExecStart") == (
        "/opt/bc/bc node --data-dir /var/lib/bc-node --helper-socket /run/bc-helper/helper.sock --allow-gpu-reset"
    )
    assert (one(unit, "User"), one(unit, "Group")) == ("bc", "bc")
    assert one(unit, "CapabilityBoundingSet") == "" and one(unit, "AmbientCapabilities") == ""
    assert one(unit, "Requires", "Unit") == "bc-helper.service"
    assert one(unit, "After", "Unit").split()[0] == "bc-helper.service"
    assert writable(unit) == {"/var/lib/bc-node"}  # /etc/cdi, /run/bc/allocations and the host's files: the helper's
    assert one(unit, "ProtectKernelLogs") == "yes"  # its XIDs are the helper's stream (kmsg.follow)
    assert one(unit, "InaccessiblePaths") == "-/dev/tpm0 -/dev/tpmrm0"  # its TPM is the helper's (tpm.*)
    assert "SupplementaryGroups" not in unit["Service"] or "tss" not in one(unit, "SupplementaryGroups")
    assert one(unit, "Restart") == "always"


def test_the_helper_unit_is_root_always_restarted_and_serves_the_nodes_user_only() -> None:
    unit = printed("helper", "--user", "gpu-agent", "--bin", "/opt/bc/bc")
    assert one(unit, "ExecStart") == ("/opt/bc/bc helper --socket /run/bc-helper/helper.sock --allow-user gpu-agent")
    assert "User" not in unit["Service"]  # root
    assert (one(unit, "Restart"), one(unit, "RestartSec")) == ("always", "2")
    assert one(unit, "RuntimeDirectory") == "bc-helper"
    assert one(unit, "IPAddressDeny") == "any"
    assert (one(unit, "Wants", "Unit"), one(unit, "After", "Unit")) == ("tpm2.target", "tpm2.target")
    assert "DevicePolicy" not in unit["Service"] and "PrivateDevices" not in unit["Service"]  # /dev/tpmrm0 is open


def test_a_root_user_for_the_unprivileged_unit_is_refused() -> None:
    result = run("unit", "print", "node", "--user", "root")
    assert result.exit_code == 2 and "--as-root" in result.stderr


# -- systemd's own judgement ---------------------------------------------------------------


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_both_units(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists and is executable: point it at this interpreter.
    files = []
    node_args = ("node", "--as-root", "--allow-reboot", "--upload-allow", "https://logs.example/bc/")
    for name, args in (
        ("bc-serve.service", ("serve",)),
        ("bc-node.service", node_args),
        ("bc-node-external.service", ("node", "--as-root", "--no-host-units")),
        ("bc-node-unprivileged.service", ("node", "--allow-reboot")),
        ("bc-helper.service", ("helper",)),
    ):
        result = run("unit", "print", *args, "--bin", sys.executable)
        assert result.exit_code == 0, result.output
        path = tmp_path / name
        path.write_text(result.stdout)
        files.append(path)
    verify = subprocess.run(["systemd-analyze", "verify", *map(str, files)], capture_output=True, text=True, timeout=60)
    # verify exits 0 even for unknown keys and unparsable values; it names the unit when it complains.
    complaints = [line for line in (verify.stdout + verify.stderr).splitlines() if any(f.name in line for f in files)]
    assert verify.returncode == 0 and not complaints, verify.stdout + verify.stderr


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (("frobnicate",), "unknown unit 'frobnicate'"),
        (("node", "--data-dir", "relative/dir"), "absolute path"),
        (("node", "--cdi-dir", "/etc/../cdi"), "absolute path"),
        (("serve", "--data-dir", "/var/lib/bc 2"), "characters"),
        (("serve", "--data-dir", "/var/lib/%n"), "characters"),
        (("serve", "--listen", "7443"), "HOST:PORT"),
        (("node", "--bin", "bc"), "absolute path"),
        (("node", "--upload-allow", "ftp://logs.example/"), "http(s) URL"),
        (("node", "--upload-allow", "https://logs.example/bc/?sig=1"), "query or fragment"),
        (("node", "--upload-allow", "https://logs.example/b%63/"), "characters"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], mentions: str) -> None:
    result = run("unit", "print", *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and mentions in lines[0], result.stderr


# -- version ---------------------------------------------------------------------------------


def test_version_first_line_is_unchanged_and_names_the_libraries() -> None:
    result = run("--version")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"bc {bc_version_module.bc_version()}"
    keys = [line.split(":", 1)[0] for line in lines[1:]]
    assert keys == ["commit", "built", "python", "grpcio", "cryptography", "textual"]


def test_version_json() -> None:
    result = run("version", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["version"] == bc_version_module.bc_version()
    assert set(doc["libraries"]) == {"grpcio", "cryptography", "textual"}
    assert doc["python"].startswith("{}.{}.{}".format(*sys.version_info[:3]))


def test_baked_build_info_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    baked = types.ModuleType("bc._build_info")
    baked.VERSION = "9.9.9"  # type: ignore[attr-defined]
    baked.COMMIT = "abc123def456"  # type: ignore[attr-defined]
    baked.BUILD_DATE = "2026-01-02T03:04:05Z"  # type: ignore[attr-defined]
    baked.ARTIFACT = "binary"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bc._build_info", baked)
    info = bc_version_module.build_info()
    assert (info.version, info.commit, info.build_date, info.artifact) == (
        "9.9.9",
        "abc123def456",
        "2026-01-02T03:04:05Z",
        "binary",
    )
    assert info.text().splitlines()[:3] == [
        "bc 9.9.9",
        "commit:       abc123def456",
        "built:        2026-01-02T03:04:05Z (binary)",
    ]


def test_without_build_info_or_git_the_commit_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bc._build_info", None)  # `import` raises ImportError
    monkeypatch.setattr(bc_version_module, "_checkout_root", lambda: None)
    info = bc_version_module.build_info()
    assert (info.commit, info.build_date, info.artifact) == ("unknown", "unknown", "installed")


def test_a_checkout_without_git_on_path_is_unknown_not_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "bc._build_info", None)
    monkeypatch.setattr(bc_version_module, "_checkout_root", lambda: tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no git to run
    info = bc_version_module.build_info()
    assert (info.commit, info.artifact) == ("unknown", "checkout")


def test_an_absent_library_is_not_installed() -> None:
    assert bc_version_module.library_version("bc-no-such-distribution") == "not installed"

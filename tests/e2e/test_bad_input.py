"""Bad input at the CLI: a non-zero exit, one `error:` line on stderr, no traceback, nothing stored."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from .harness import Lab, assert_no_tracebacks, free_port, port_accepts


def without_ages(obj: Any) -> Any:
    """Drop the fields that move by themselves (`*_age_ms`) so two snapshots can be compared."""
    if isinstance(obj, dict):
        return {k: without_ages(v) for k, v in obj.items() if not k.endswith("_age_ms")}
    if isinstance(obj, list):
        return [without_ages(v) for v in obj]
    return obj


def stored(lab: Lab) -> dict[str, Any]:
    return {
        "nodes": without_ages(lab.bc("nodes")),
        "reservations": without_ages(lab.bc("reservations", "--all")),
        "spec n1": lab.bc("spec", "show", "n1"),
    }


def refusal_problems(label: str, r: subprocess.CompletedProcess[str], mentions: str | None = None) -> list[str]:
    """What is wrong with how `bc` refused: each problem as one line naming the case."""
    problems = []
    lines = r.stderr.splitlines()
    if r.returncode == 0:
        problems.append(f"{label}: exited 0 (stdout {r.stdout.strip()[:200]!r})")
    if len(lines) != 1 or not lines[0].startswith("error:"):
        problems.append(f"{label}: stderr is not one line starting 'error:': {r.stderr!r}")
    if "Traceback" in r.stderr + r.stdout:
        problems.append(f"{label}: printed a traceback: {r.stderr[-500:]!r}")
    if mentions is not None and mentions not in r.stderr:
        problems.append(f"{label}: stderr does not mention {mentions!r}: {r.stderr!r}")
    return problems


@pytest.mark.e2e
def test_bad_input(lab: Lab) -> None:
    lab.serve()
    n1_token = lab.token("n1")
    lab.join("n1", n1_token)
    lab.node("n1")
    lab.wait_converged("n1")

    # Another control plane, with a CA of its own, to take a wrong pin from.
    other_dir = lab.root / "server2"
    lab.serve(name="serve2", data_dir=other_dir, port=free_port())
    other_pin = lab.token("x1", server_dir=other_dir).rsplit(".", 1)[1]
    n7_token = lab.token("n7")
    head, _, pin = n7_token.rpartition(".")
    assert pin != other_pin
    wrong_pin_token = f"{head}.{other_pin}"

    before = stored(lab)
    server = lab.address
    cases: list[tuple[str, tuple[str, ...], str | None]] = [
        (
            "malformed token",
            ("join", "--server", server, "--token", "bc1.not-a-token", "--data-dir", str(lab.root / "j-bad")),
            None,
        ),
        (
            "reused token",
            ("join", "--server", server, "--token", n1_token, "--data-dir", str(lab.root / "j-reused")),
            "already been used",
        ),
        (
            "token with another CA's pin",
            ("join", "--server", server, "--token", wrong_pin_token, "--data-dir", str(lab.root / "j-pin")),
            None,
        ),
        ("more GPUs than the node has", ("reserve", "--gpus", "99", "--node", "n1"), None),
        ("reserve on an unknown node", ("reserve", "--gpus", "1", "--node", "nosuch"), None),
        ("show an unknown node", ("nodes", "show", "nosuch"), None),
        ("section that is not JSON", ("spec", "set", "n1", "telemetry", "{not json"), None),
        ("section with an unknown field", ("spec", "set", "n1", "telemetry", '{"no_such_field":1}'), None),
        ("invalid node id", ("token", "create", "--node-id", "Bad Id!"), None),
        ("invalid ttl", ("token", "create", "--node-id", "n9", "--ttl", "3x"), None),
    ]
    problems: list[str] = []
    for label, args, mentions in cases:
        problems += refusal_problems(label, lab.run(*args), mentions)
    for d in ("j-bad", "j-reused", "j-pin"):
        if (lab.root / d).exists() and any((lab.root / d).iterdir()):
            problems.append(f"a failed join left files in {d}: {sorted(p.name for p in (lab.root / d).iterdir())}")

    after = stored(lab)
    for key in before:
        if after[key] != before[key]:
            problems.append(f"{key} changed:\n  before {before[key]}\n  after  {after[key]}")

    # A refused pin must not burn the token: the genuine one still joins.
    genuine = lab.run("join", "--server", server, "--token", n7_token, "--data-dir", str(lab.root / "node-n7"))
    if genuine.returncode != 0:
        problems.append(f"the n7 token no longer joins after a wrong-pin attempt: {genuine.stderr!r}")

    assert not problems, "\n".join(problems)
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_unexpected_input_is_a_sentence_and_the_documented_exit_code(lab: Lab) -> None:
    """Hostile or careless input: exit 2 (or 6 for a refused identity), one line, nothing stored."""
    lab.serve()
    lab.join("n1", lab.token("n1"))
    lab.node("n1")
    lab.wait_converged("n1")
    lab.bc("spec", "set", "n1", "telemetry", '{"otlp_endpoint": "http://127.0.0.1:4317"}')

    token = lab.token("n7")
    parts = token.split(".")
    parts[2] = ("A" if parts[2][0] != "A" else "B") + parts[2][1:]
    wrong_secret = ".".join(parts)

    not_utf8 = lab.root / "payload-latin1.json"
    not_utf8.write_bytes(b'{"upload_url": "http://caf\xe9/"}')
    deep = "[" * 30_000 + "]" * 30_000  # one argv string holds at most 128 KiB

    before = stored(lab)
    server = lab.address
    cases: list[tuple[str, tuple[str, ...], int, str | None]] = [
        (
            "token whose secret does not match",
            ("join", "--server", server, "--token", wrong_secret, "--data-dir", str(lab.root / "j-secret")),
            6,
            "secret does not match",
        ),
        ("payload nested 30,000 deep", ("cmd", "run", "n1", "inventory.refresh", "--payload", deep), 2, "nests"),
        ("payload file not UTF-8", ("cmd", "run", "n1", "logs.collect", "--payload", f"@{not_utf8}"), 2, "UTF-8"),
        ("seq beyond int64", ("events", "--after", str(2**70)), 2, None),
        ("gpus beyond any node", ("reserve", "--gpus", "99999999999"), 2, None),
        (
            "deadline of ten thousand years",
            ("cmd", "run", "n1", "inventory.refresh", "--not-after", "3650000d"),
            2,
            "ten",
        ),
        ("node id with a trailing newline", ("token", "create", "--node-id", "n9\n"), 2, "invalid node id"),
        (
            "escape sequence in a spec string",
            ("spec", "set", "n1", "telemetry", '{"resource_attributes": {"rack": "r1\\u001b]0;pwned\\u0007"}}'),
            2,
            "U+001B",
        ),
        ("unit name that is a path", ("spec", "set", "n1", "host", '{"units": [{"name": "../../etc/x"}]}'), 2, None),
        (
            "settings_json that is not an object",
            ("spec", "set", "n1", "host", '{"units": [{"name": "sysctl", "settings_json": "[1]"}]}'),
            2,
            "JSON object",
        ),
    ]
    problems: list[str] = []
    for label, args, code, mentions in cases:
        r = lab.run(*args)
        problems += refusal_problems(label, r, mentions)
        if r.returncode != code:
            problems.append(f"{label}: exit {r.returncode}, not {code}: {r.stderr.strip()!r}")
        if "Error:" in r.stderr.replace("error:", "") and "Usage:" not in r.stderr:
            problems.append(f"{label}: a Python class name leaked: {r.stderr!r}")
    if (lab.root / "j-secret").exists() and any((lab.root / "j-secret").iterdir()):
        problems.append("a refused join left files behind")
    after = stored(lab)
    for key in before:
        if after[key] != before[key]:
            problems.append(f"{key} changed:\n  before {before[key]}\n  after  {after[key]}")

    # The real token still joins: a wrong secret burns nothing.
    if lab.run("join", "--server", server, "--token", token, "--data-dir", str(lab.root / "j-ok")).returncode != 0:
        problems.append("the genuine n7 token no longer joins after a wrong-secret attempt")
    # Filters are literal: `_` is a character, not a wildcard.
    if lab.bc("events", "--type", "node_") != []:
        problems.append("`bc events --type node_` matched events whose type has no underscore")
    if not lab.bc("events", "--type", "node."):
        problems.append("`bc events --type node.` matched nothing")
    assert not problems, "\n".join(problems)
    assert_no_tracebacks(lab)


@pytest.mark.e2e
def test_bc_serve_refuses_a_flag_its_roles_would_ignore_before_it_starts(lab: Lab) -> None:
    """Keys follow roles, and so do flags (bc.assembly.roles): an explicit `--listen` on a worker-only process (it
    serves no call), the other listener flags there, `--api` beside the api role and `--command-signing`
    without it are refused: exit 2, one line naming the flag, no data dir made, nothing listening."""
    port = free_port()
    data_dir = lab.root / "refused"
    here = f"127.0.0.1:{port}"
    cases: list[tuple[str, tuple[str, ...], str]] = [
        ("--listen on a worker-only process", ("--roles", "worker", "--listen", here), "--listen needs a role that"),
        ("--release-listen on a worker-only process", ("--roles", "worker", "--release-listen", here), "--release"),
        ("--advertise on a worker-only process", ("--roles", "worker", "--advertise", "ctl.lab"), "--advertise"),
        ("--api beside the api role", ("--roles", "api,gateway", "--listen", here, "--api", "127.0.0.1:1"), "--api"),
        ("--command-signing without the api role", ("--roles", "gateway,worker", "--command-signing", "on"), "--comm"),
    ]
    problems: list[str] = []
    for label, args, mentions in cases:
        r = lab.run("serve", *args, "--data-dir", str(data_dir), timeout=20)
        problems += refusal_problems(label, r, mentions)
        if r.returncode != 2:
            problems.append(f"{label}: exit {r.returncode}, not 2 (a usage error): {r.stderr.strip()!r}")
    if data_dir.exists():
        problems.append(f"a refused bc serve made its data dir: {sorted(p.name for p in data_dir.iterdir())}")
    if port_accepts(port):
        problems.append(f"something listens on {here}")
    assert not problems, "\n".join(problems)

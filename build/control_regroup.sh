#!/bin/sh
# Group bc/control/'s modules into packages (issue 31): run from the repository's root on a clean tree,
#   sh build/control_regroup.sh [/work/tools/regroup.py]
# then `make lint`. It splits `from bc.control import a, b` into one line a name (regroup.py rewrites only
# single-name imports), runs regroup.py twice (control_groups.pre.map first: a module named like its new
# group moves aside, else rewriting the old capacity module's name would also rewrite the new capacity.views),
# gives each group's __init__.py its one-line purpose, and lets ruff sort and merge the imports again.
set -eu
REGROUP=${1:-/work/tools/regroup.py}
RUFF=${RUFF:-.venv/bin/ruff}
python3 - <<'PY'
import ast, subprocess
from pathlib import Path

files = subprocess.run(["git", "ls-files", "*.py"], capture_output=True, text=True, check=True).stdout.split()
for f in files:
    path = Path(f)
    text = path.read_text()
    if "from bc.control import" not in text:
        continue
    lines = text.splitlines(keepends=True)
    found = [
        n for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.ImportFrom) and n.module == "bc.control" and n.level == 0 and len(n.names) > 1
    ]
    for n in sorted(found, key=lambda n: -n.lineno):
        first = lines[n.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        one = [f"{indent}from bc.control import {a.name}{f' as {a.asname}' if a.asname else ''}\n" for a in n.names]
        lines[n.lineno - 1 : n.end_lineno] = one
    if found:
        path.write_text("".join(lines))
PY
python3 "$REGROUP" build/control_groups.pre.map
python3 "$REGROUP" build/control_groups.map
python3 - <<'PY'
from pathlib import Path

PURPOSE = {
    "base": "What every group of the control plane uses: the wake-up bus, the events log, the acting operator and the roles.",
    "signing": "What signs intent on the control plane (the Signer), and the check of what a node signed with its own key.",
    "commands": "The command queue: enqueue, the state table, runs of many, the gateway's dispatch pass, the sweeper.",
    "nodes": "Nodes and connectivity: the NodeSpec writer, liveness, status reports, taking a node out.",
    "capacity": "Capacity: atoms, the placement pass, reservations, usage windows and the invariants (docs/capacity.md).",
    "quorum": "The quorum: approvers and k, destructive batches, root-equivalent spec changes (docs/quorum.md).",
    "trust": "Trust and identity: the bundle nodes trust, joining and renewal, operators, SSH, releases, serving certs.",
    "reads": "Every read the Admin API serves (queries), and the mappers from store rows to its messages (views).",
    "doctor": "`bc doctor` on a server's data dir, and this process's clock against the store's.",
}
for group, purpose in PURPOSE.items():
    Path("bc/control", group, "__init__.py").write_text(f'"""{purpose}"""\n')
PY
"$RUFF" format --quiet .
"$RUFF" check --fix --quiet .
"$RUFF" format --quiet .

"""The `bc` command line: click commands that parse, call a library function and render.

`main.py` holds the group and the error-to-exit-code mapping, `admin_cmds.py`
the operator's commands (all through `client.AdminClient`), `run_cmds.py` the
long-running ones (serve, join, node), `render.py` the tables and JSON.
"""

# Quiets grpc's handshake logging before any module here imports grpc (see bc/wire/__init__.py).
import bc.wire  # noqa: F401

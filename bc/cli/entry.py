"""The `bc` executable's entry point: the POSIX calculator's calls first, then ours.

`bc.cli.posix_bc.hand_off` decides, from the arguments and stdin alone, whether
this is `echo 1+1 | bc` or `bc -l` and if so execs the system calculator; it
runs before click, protobuf or any command module is imported, so a script's
arithmetic does not pay for them. Every other call goes to `bc.cli.main.main`.
"""

from __future__ import annotations

import sys

from bc.cli.posix_bc import hand_off


def main() -> None:
    """The console script `bc` (pyproject.toml), the zipapp's and the binary's entry."""
    hand_off(sys.argv[1:])
    from bc.cli.main import main as bc_main

    bc_main()


if __name__ == "__main__":
    main()

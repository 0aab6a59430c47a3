import os
from tests.integration.test_cli_cmd import bc, lab  # noqa

def test_probe(lab, tmp_path):
    big = "a" * 20480
    for args in (["nodes", "show", big] , ["reserve", "--gpus", "1", "--node", big], ["reserve", "--gpus", "1", "--cpus", "2147483648"],
                 ["reserve", "--gpus", "1", "--memory", "99999999999T"], ["reserve", "--gpus", "1", "--hugepages-1g", "99999999999"],
                 ["reserve", "--gpus", "1", "--tenant", "a\x1bb\nc"], ["cmd", "show", big], ["reserve","--gpus","1","--start","+10m"]):
        r = bc(*args)
        print(args[:2], len(args[-1]), "->", r.exit_code, repr((r.stdout+ (r.stderr if r.stderr_bytes is not None else ""))[:300]))

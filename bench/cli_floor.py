"""The least a Python client of `bc serve` does for `bc nodes`: the floor `bench.cli_start` compares against.

gRPC, our generated messages, the operator config read as JSON, one `ListNodes`
over mutual TLS (a new connection, as every CLI call makes; the one method made
on the channel, not the generated stub's 59), the reply's size on stdout. No
click, no bc client or renderer: what is left between this and `bc nodes
--json` is the CLI's own cost; what is between this and `python -c 'import
grpc'` is protobuf's and the call's.

Run as a script (`python bench/cli_floor.py`), with BC_CONFIG naming the operator config.
"""

import json
import os
import sys
from pathlib import Path

import grpc

from bc.cli.lazy_protobuf import defer_python_message

defer_python_message()  # as `bc` does, so the floor moves with the CLI's own start

from bc.protocol.pb import admin_pb2  # noqa: E402


def main() -> None:
    path = Path(os.environ["BC_CONFIG"])
    doc = json.loads(path.read_text())
    ca, cert, key = ((path.parent / doc[k]).read_bytes() for k in ("ca", "cert", "key"))
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    with grpc.secure_channel(doc["server"], creds) as channel:
        list_nodes = channel.unary_unary(
            "/bc.v1.Admin/ListNodes",
            request_serializer=admin_pb2.ListNodesRequest.SerializeToString,
            response_deserializer=admin_pb2.ListNodesResponse.FromString,
            _registered_method=True,
        )
        reply = list_nodes(admin_pb2.ListNodesRequest(), timeout=15)
    sys.stdout.write(f"{len(reply.nodes)}\n")


if __name__ == "__main__":
    main()

"""`bc` defers protobuf's pure-Python message code: unread with upb, whole the moment anything reads it.

Each case runs in a new interpreter, as `bc` starts: the deferral only means something before protobuf's
first import, and this test process imported it long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PRELUDE = """
import json, sys
from bc.cli.lazy_protobuf import PYTHON_MESSAGE, defer_python_message
"""


def run(code: str, **env: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, check=True, env={**os.environ, **env}
    )
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_messages_parse_and_render_without_loading_it() -> None:
    out = run("""
deferred = defer_python_message()
from bc.cli.emit import jsonable
from bc.protocol.pb import admin_pb2
wire = admin_pb2.ListNodesResponse(nodes=[admin_pb2.NodeInfo(node_id="n1", labels={"a": "b"})]).SerializeToString()
doc = jsonable(list(admin_pb2.ListNodesResponse.FromString(wire).nodes))
print(json.dumps({"deferred": deferred, "labels": doc[0]["labels"],
                  "loaded": "google.protobuf.text_format" in sys.modules}))
""")
    assert out == {"deferred": True, "labels": {"a": "b"}, "loaded": False}


def test_the_first_read_loads_it_whole() -> None:
    out = run("""
defer_python_message()
from bc.protocol.pb import admin_pb2
from google.protobuf.internal import python_message
cls = python_message.GeneratedProtocolMessageType
from google.protobuf import json_format  # which reads text_format and friends: all there
text = json_format.MessageToJson(admin_pb2.NodeInfo(node_id="n1"), indent=None)
print(json.dumps({"cls": cls.__name__, "module": type(sys.modules[PYTHON_MESSAGE]).__name__,
                  "text": text, "loaded": "google.protobuf.text_format" in sys.modules}))
""")
    assert out["cls"] == "GeneratedProtocolMessageType" and out["module"] == "module"  # a plain module now
    assert out["text"] == '{"nodeId": "n1"}' and out["loaded"] is True


def test_nothing_is_deferred_once_protobuf_is_loaded_or_with_the_python_backend() -> None:
    late = run("""
from bc.protocol.pb import admin_pb2
print(json.dumps({"deferred": defer_python_message(), "module": type(sys.modules[PYTHON_MESSAGE]).__name__}))
""")
    assert late == {"deferred": False, "module": "module"}
    pure = run(
        """
deferred = defer_python_message()
from bc.protocol.pb import admin_pb2
node = admin_pb2.NodeInfo.FromString(admin_pb2.NodeInfo(node_id="n1").SerializeToString())
print(json.dumps({"deferred": deferred, "node": node.node_id}))
""",
        PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python",
    )
    assert pure == {"deferred": False, "node": "n1"}

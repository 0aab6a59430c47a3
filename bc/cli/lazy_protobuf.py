"""Protobuf's pure-Python message code, loaded only if something uses it.

`google.protobuf.descriptor_pool` imports `internal.python_message` (and with it
text_format, the decoders, the containers, pickle, datetime and calendar) on
every start, though with the upb backend, the one installed, no call reaches it:
about a third of what importing our generated messages costs a one-shot
`bc nodes`. `defer_python_message` puts a lazy module in its place, so the import
statements succeed and the module's code runs at the first attribute anything
reads from it: protobuf behaves as before, only later, if ever.

With the pure-Python backend (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python)
every message uses it, so nothing is deferred.
"""

from __future__ import annotations

import importlib.util
import sys

PYTHON_MESSAGE = "google.protobuf.internal.python_message"


def defer_python_message() -> bool:
    """Before protobuf's first import: `python_message` loads at its first use. True if it was deferred."""
    if PYTHON_MESSAGE in sys.modules:
        return False  # protobuf is loaded already: too late, and nothing to gain
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() == "python":
        return False
    spec = importlib.util.find_spec(PYTHON_MESSAGE)
    if spec is None or spec.loader is None:
        return False
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[PYTHON_MESSAGE] = module
    loader.exec_module(module)
    # `from google.protobuf.internal import python_message` finds it on the package without reading it:
    # the import system's own check of a module in sys.modules (its __spec__) would load it at once.
    import google.protobuf.internal

    google.protobuf.internal.python_message = module  # type: ignore[attr-defined]
    return True

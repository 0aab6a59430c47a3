"""The gRPC side of `bc`: TLS credentials, stubs and status mapping.

grpc logs every failed TLS handshake at INFO, which at a fleet's scale (and
with join tokens refused by design until they are trusted) drowns real
errors. Quiet it to ERROR before grpc is first imported, unless the operator
asked otherwise.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

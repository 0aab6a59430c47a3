"""Suite-wide setup. grpc reads GRPC_VERBOSITY once, at its first import, so set it before anything imports grpc."""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

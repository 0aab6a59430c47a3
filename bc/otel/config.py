"""An OTLP destination: endpoint, protocol, interval and resource attributes, checked before anything runs.

The endpoint is a URL: `http://` (plain) or `https://` (TLS), a host and a
port. The protocol is `grpc` or `http/protobuf` (`http` is accepted for the
latter); left empty, it follows the port: 4318 is OTLP/HTTP's port, anything
else is taken as gRPC (4317). For HTTP a bare endpoint gets OTLP's metrics
path `/v1/metrics`; for gRPC a path is refused (gRPC has none).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

GRPC = "grpc"
HTTP = "http/protobuf"
HTTP_PORT = 4318
DEFAULT_INTERVAL_S = 60.0
MIN_INTERVAL_S = 1.0
MAX_INTERVAL_S = 86_400.0


class BadOtlpConfig(ValueError):
    """The sentence an operator reads: what is wrong with the OTLP settings."""


@dataclass(frozen=True)
class OtlpConfig:
    endpoint: str
    """For gRPC `host:port`; for HTTP the full URL of the metrics path."""
    protocol: str
    secure: bool
    interval_s: float = DEFAULT_INTERVAL_S
    resource: Mapping[str, str] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """From the section's `headers_secret_ref` (docs/secrets.md): sent with every export, never logged."""


def parse(
    endpoint: str, protocol: str = "", interval_s: float = 0, resource: Mapping[str, str] | None = None
) -> OtlpConfig:
    text = endpoint.strip()
    if not text or any(c.isspace() for c in text):
        raise BadOtlpConfig(f"OTLP endpoint {endpoint!r} is not a URL: write http(s)://HOST:PORT")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadOtlpConfig(f"OTLP endpoint {endpoint!r} is not a URL: write http(s)://HOST:PORT")
    try:
        port = parts.port
    except ValueError:
        raise BadOtlpConfig(f"OTLP endpoint {endpoint!r} has a port that is not a number from 1 to 65535") from None
    host = parts.hostname
    if not host or parts.username or parts.password or parts.query or parts.fragment:
        raise BadOtlpConfig(
            f"OTLP endpoint {endpoint!r} must be http(s)://HOST:PORT[/PATH], no user, query or fragment"
        )
    secure = parts.scheme == "https"
    port = port or (443 if secure else 80)
    proto = protocol.strip().lower()
    if proto == "http":
        proto = HTTP
    if not proto:
        proto = HTTP if port == HTTP_PORT else GRPC
    if proto not in (GRPC, HTTP):
        raise BadOtlpConfig(f"OTLP protocol {protocol!r} is neither grpc nor http/protobuf")
    host_port = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if proto == GRPC:
        if parts.path not in ("", "/"):
            raise BadOtlpConfig(f"OTLP endpoint {endpoint!r}: gRPC takes no path, only http(s)://HOST:PORT")
        target = host_port
    else:
        path = parts.path if parts.path not in ("", "/") else "/v1/metrics"
        target = f"{parts.scheme}://{host_port}{path}"
    interval = float(interval_s) if interval_s else DEFAULT_INTERVAL_S
    if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
        raise BadOtlpConfig(
            f"OTLP export interval {interval_s!r} s is outside {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g} seconds"
        )
    return OtlpConfig(target, proto, secure, interval, dict(resource or {}))


_HEADER_KEY = re.compile(r"[a-z0-9][a-z0-9_.-]*")


def parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """OTLP headers from a secret's value: `key=value` entries separated by commas or newlines, values
    percent-decoded, as OTEL_EXPORTER_OTLP_HEADERS writes them. Keys are lower-cased (gRPC metadata is).

    The sentence of a BadOtlpConfig names the entry by its position and never quotes it: the text is a
    secret."""
    out: list[tuple[str, str]] = []
    entries = [e.strip() for e in re.split(r"[,\n]", text)]
    for i, entry in enumerate(entries, 1):
        if not entry:
            continue
        key, eq, value = entry.partition("=")
        key = key.strip().lower()
        if not eq or not _HEADER_KEY.fullmatch(key):
            raise BadOtlpConfig(
                f"entry {i} of the headers secret is not KEY=VALUE with a header name (letters, digits, '-', '_', '.')"
            )
        if key.startswith("grpc-") or key in ("te", "content-type", "user-agent"):
            raise BadOtlpConfig(f"entry {i} of the headers secret sets a header the transport owns")
        decoded = unquote(value.strip())
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in decoded):
            raise BadOtlpConfig(f"entry {i} of the headers secret has a control character in its value")
        out.append((key, decoded))
    if not out:
        raise BadOtlpConfig("the headers secret holds no KEY=VALUE entry")
    return tuple(out)

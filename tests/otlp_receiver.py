"""Real OTLP metric receivers on 127.0.0.1 for the telemetry tests: gRPC and HTTP/protobuf, in threads.

Each keeps every `ExportMetricsServiceRequest` it was sent, decoded with
opentelemetry-proto, and sets `got` on each, so a test waits on an event.
`points(name)` flattens what arrived: one (attributes, value, resource) per
data point of that metric, the newest export last.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Received:
    requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    """Each request's headers (gRPC metadata, or HTTP headers with lower-cased names), in arrival order."""
    got: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, req: metrics_service_pb2.ExportMetricsServiceRequest, headers: dict[str, str] | None = None) -> None:
        with self.lock:
            self.requests.append(req)
            self.headers.append(headers or {})
        self.got.set()

    def header_values(self, name: str) -> list[str]:
        """The value of header `name` on every request so far ("" where it was absent)."""
        with self.lock:
            return [h.get(name, "") for h in self.headers]

    def names(self) -> set[str]:
        with self.lock:
            return {
                m.name
                for r in self.requests
                for rm in r.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            }

    def points(self, name: str) -> list[tuple[dict[str, Any], float, dict[str, Any]]]:
        out = []
        with self.lock:
            requests = list(self.requests)
        for r in requests:
            for rm in r.resource_metrics:
                resource = {a.key: _value(a.value) for a in rm.resource.attributes}
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name != name:
                            continue
                        kind = m.WhichOneof("data")
                        for p in getattr(m, kind).data_points:
                            attrs = {a.key: _value(a.value) for a in p.attributes}
                            if kind in ("gauge", "sum"):
                                value = float(getattr(p, p.WhichOneof("value")))
                            else:
                                value = float(p.count)  # a histogram: how many observations
                            out.append((attrs, value, resource))
        return out

    def wait(self, predicate: Any, timeout: float = 20.0) -> None:
        """Until `predicate(self)` holds after some export; raises AssertionError with the names seen."""
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        try:
            while not deadline.is_set():
                if predicate(self):
                    return
                self.got.wait(0.2)
                self.got.clear()
        finally:
            timer.cancel()
        raise AssertionError(f"no export satisfied the predicate in {timeout}s; metrics seen: {sorted(self.names())}")


class _Service(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:
        metadata = {str(k): str(v) for k, v in context.invocation_metadata()}
        self.received.add(request, metadata)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@contextlib.contextmanager
def grpc_receiver() -> Iterator[tuple[int, Received]]:
    received = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Service(received), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port, received
    finally:
        server.stop(0).wait()


@contextlib.contextmanager
def http_receiver() -> Iterator[tuple[int, Received]]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/metrics" or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            req = metrics_service_pb2.ExportMetricsServiceRequest()
            req.ParseFromString(body)
            received.add(req, {k.lower(): v for k, v in self.headers.items()})
            out = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="otlp-http", daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()

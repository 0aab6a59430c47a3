"""OTLP settings (bc.otel.config): what is a URL, which protocol a port means, the interval's bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.otel.config import GRPC, HTTP, BadOtlpConfig, parse


def test_the_port_chooses_the_protocol_unless_it_is_named() -> None:
    assert parse("http://collector:4317").protocol == GRPC
    assert parse("http://collector:4317").endpoint == "collector:4317"
    assert parse("http://collector:4318").protocol == HTTP
    assert parse("http://collector:4318").endpoint == "http://collector:4318/v1/metrics"
    assert parse("https://collector:9000", "http").endpoint == "https://collector:9000/v1/metrics"
    assert (
        parse("https://collector:9000/otlp/metrics", "http/protobuf").endpoint == "https://collector:9000/otlp/metrics"
    )
    cfg = parse("https://[::1]:4317")
    assert (cfg.endpoint, cfg.secure) == ("[::1]:4317", True)
    assert not parse("http://c:4317").secure


def test_interval_defaults_to_a_minute_and_resource_attributes_are_kept() -> None:
    cfg = parse("http://c:4317", "", 0, {"site": "lab"})
    assert (cfg.interval_s, dict(cfg.resource)) == (60.0, {"site": "lab"})
    assert parse("http://c:4317", "", 10).interval_s == 10.0


@pytest.mark.parametrize(
    ("endpoint", "protocol", "interval", "why"),
    [
        ("collector:4317", "", 0, "is not a URL"),
        ("not a url", "", 0, "is not a URL"),
        ("ftp://c:4317", "", 0, "is not a URL"),
        ("http://", "", 0, "is not a URL"),
        ("http://c:99999", "", 0, "port that is not a number"),
        ("http://u:p@c:4317", "", 0, "no user, query or fragment"),
        ("http://c:4317/v1/metrics", "grpc", 0, "gRPC takes no path"),
        ("http://c:4317", "thrift", 0, "neither grpc nor http/protobuf"),
        ("http://c:4317", "", 0.5, "outside 1 to 86400 seconds"),
        ("http://c:4317", "", 90000, "outside 1 to 86400 seconds"),
    ],
)
def test_bad_settings_say_why(endpoint: str, protocol: str, interval: float, why: str) -> None:
    with pytest.raises(BadOtlpConfig, match=why):
        parse(endpoint, protocol, interval)


@given(st.text(max_size=40))
def test_any_text_is_a_config_or_one_sentence(text: str) -> None:
    try:
        cfg = parse(text)
    except BadOtlpConfig as e:
        assert str(e) and "\n" not in str(e).replace(repr(text), "")
    else:
        assert cfg.protocol in (GRPC, HTTP) and cfg.endpoint


def test_the_cli_and_the_agent_import_without_opentelemetry() -> None:
    """`bc nodes --json` and an agent without a telemetry section never load the SDK (docs/telemetry.md)."""
    import subprocess
    import sys

    code = (
        "import sys, agent.app, bc.cli.main, bc.assembly.server, bc.otel.config;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout

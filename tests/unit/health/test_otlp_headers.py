"""The OTLP headers a secret holds (bc.otel.config.parse_headers): parsed, or refused without quoting them."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.otel.config import BadOtlpConfig, parse, parse_headers


def test_entries_by_comma_or_line_percent_decoded_and_kept_out_of_repr() -> None:
    assert parse_headers("Authorization=Bearer%20abc, x-tenant=t1\nx-b = 2") == (
        ("authorization", "Bearer abc"),
        ("x-tenant", "t1"),
        ("x-b", "2"),
    )
    cfg = parse("http://c:4317")
    with_headers = dataclasses.replace(cfg, headers=(("authorization", "Bearer abc"),))
    assert "Bearer" not in repr(with_headers)


@pytest.mark.parametrize("text", ["", "novalue", "bad key=1", "grpc-timeout=1", "a=\x01"])
def test_what_is_not_headers_is_refused(text: str) -> None:
    with pytest.raises(BadOtlpConfig):
        parse_headers(text)


@given(st.lists(st.text(max_size=20), min_size=1, max_size=4), st.sampled_from([",", "\n"]))
def test_a_refusal_never_quotes_the_secret(parts: list[str], sep: str) -> None:
    """Every piece of the value carries a marker; whatever is refused, the sentence holds none of it."""
    text = sep.join("ZQX" + p for p in parts)
    try:
        parse_headers(text)
    except BadOtlpConfig as e:
        assert "ZQX" not in str(e).upper()

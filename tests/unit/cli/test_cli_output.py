"""Nothing the CLI prints can steer the terminal (`bc.cli.output`)."""

from __future__ import annotations

import json
import unicodedata

from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bc.cli.output import echo, json_text, one_line, safe_text
from bc.cli.render import cell, dumps, render_table

BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"


def unsafe(text: str, keep: str = "") -> list[str]:
    return [c for c in text if c not in keep and (c in BIDI or unicodedata.category(c) == "Cc")]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(json_values)
def test_json_text_round_trips_and_holds_no_raw_control_or_bidi_character(value: object) -> None:
    for indent in (None, 2):
        text = json_text(value, indent=indent)
        assert json.loads(text) == value
        assert unsafe(text, keep="\n") == []


@given(st.text())
def test_safe_text_escapes_all_but_newlines_and_tabs(text: str) -> None:
    assert unsafe(safe_text(text), keep="\n\t") == []
    assert unsafe(one_line(text)) == []


def test_the_escapes_are_visible_and_plain_text_is_untouched() -> None:
    assert safe_text("n1\x1b[2J\u202eevil") == "n1\\x1b[2J\\u202eevil"
    assert one_line("a\nb\tc\rd") == "a\\x0ab\\x09c\\x0dd"
    assert safe_text("GPU-0 ok é 東京\nnext") == "GPU-0 ok é 東京\nnext"


def test_tables_and_json_of_hostile_strings() -> None:
    row = ["n1\x1b]0;owned\x07", "a\u202eb", "x\x9by"]
    table = str(render_table(("A", "B", "C"), [row]))
    assert unsafe(table, keep="\n") == [] and "\\x1b]0;owned\\x07" in table
    assert cell("x\x7fy") == "x\\x7fy"
    assert unsafe(dumps({"k": row}), keep="\n") == []


def test_echo_is_what_leaves_the_cli() -> None:
    import click

    @click.command()
    def cmd() -> None:
        echo("ok\x1b[31m red")

    out = CliRunner().invoke(cmd).output
    assert out == "ok\\x1b[31m red\n"


def test_a_string_is_one_line_and_lines_are_built_from_escaped_pieces() -> None:
    import click

    from bc.cli.output import Lines, lines, paragraphs

    table = lines("HEAD", ["n1\nforged", "ok"])
    assert list(table) == ["HEAD", "n1\\x0aforged", "ok"]
    assert str(paragraphs(table, lines(), "tail\r")) == "HEAD\nn1\\x0aforged\nok\n\ntail\\x0d"
    assert list(Lines(["built\nby hand"])) == ["built\\x0aby hand"]  # escaped whoever builds it

    @click.command()
    def cmd() -> None:
        echo("host n1\nn9\rx")
        echo(table)

    assert CliRunner().invoke(cmd).output == "host n1\\x0an9\\x0dx\nHEAD\nn1\\x0aforged\nok\n"


def test_log_records_are_one_line_each() -> None:
    import logging

    from bc.runtime.logs import OneLineFormatter

    record = logging.LogRecord("bc", logging.INFO, __file__, 1, "event=x node=%s", ("n1\nts=forged\x1b[2J",), None)
    assert OneLineFormatter("%(message)s").format(record) == "event=x node=n1\\x0ats=forged\\x1b[2J"

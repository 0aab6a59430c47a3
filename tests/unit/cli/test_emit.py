"""`emit`: a command's one choice between its JSON document and its text, and what reaches the terminal."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bc.cli.emit import emit
from bc.cli.render import message_to_json, render_table
from bc.protocol.pb import admin_pb2
from bc.protocol.text_safety import is_unsafe

NODE = admin_pb2.NodeInfo(node_id="n1", state="connected", generation=7, labels={"pool": "a"})


def no_raw_control(text: str) -> bool:
    """Nothing that steers a terminal: the newlines and tabs a rendering puts between lines and columns stay."""
    return not any(is_unsafe(c) for c in text if c not in "\n\t")


def test_json_is_the_document_and_text_is_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    emit(True, [NODE], lambda: render_table(("NODE",), [("n1",)]))
    out, err = capsys.readouterr()
    assert json.loads(out) == [message_to_json(NODE)] and err == ""
    assert json.loads(out)[0]["generation"] == 7  # an int64 as a number, every field present
    emit(False, [NODE], lambda: render_table(("NODE",), [("n1",)]))
    assert capsys.readouterr() == ("NODE\nn1\n", "")


def test_messages_anywhere_in_the_document_become_objects(capsys: pytest.CaptureFixture[str]) -> None:
    emit(True, {"operator": NODE, "config": "x.json", "all": (NODE,)}, "")
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"operator": message_to_json(NODE), "config": "x.json", "all": [message_to_json(NODE)]}


def test_only_the_side_printed_is_computed(capsys: pytest.CaptureFixture[str]) -> None:
    def fail() -> str:
        raise AssertionError("computed for nothing")

    emit(True, lambda: {"a": 1}, fail)
    emit(False, fail, lambda: "text")
    out = capsys.readouterr().out
    assert out == '{\n  "a": 1\n}\ntext\n'


def test_an_empty_list_says_so_on_stderr_and_prints_nothing_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    emit(False, [], lambda: "HEADER", empty="no nodes yet")
    assert capsys.readouterr() == ("", "no nodes yet\n")
    emit(True, [], lambda: "HEADER", empty="no nodes yet")
    assert capsys.readouterr() == ("[]\n", "")
    emit(False, [NODE], lambda: "HEADER", empty="no nodes yet")
    assert capsys.readouterr() == ("HEADER\n", "")
    emit(False, {"a": 1}, "")  # empty text: nothing at all
    assert capsys.readouterr() == ("", "")


def test_compact_json_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    emit(True, {"seq": 1, "type": "node.connectivity"}, "", compact=True)
    assert capsys.readouterr().out == '{"seq": 1, "type": "node.connectivity"}\n'


@given(st.text(), st.text())
def test_nothing_from_the_fleet_reaches_the_terminal_raw(name: str, message: str) -> None:
    # Hypothesis runs many examples per test, so capture by hand rather than with a function-scoped fixture.
    info = admin_pb2.CommandInfo(node_id=name, message=message)
    for as_json in (True, False):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            emit(as_json, {"command": info, "name": name}, f"{name}: {message}")
        assert no_raw_control(out.getvalue()), repr(out.getvalue())
        if as_json:
            doc = json.loads(out.getvalue())
            assert (doc["name"], doc["command"]["node_id"], doc["command"]["message"]) == (name, name, message)

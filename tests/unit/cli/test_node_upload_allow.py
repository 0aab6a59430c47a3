"""`bc node --upload-allow`: a prefix the agent could not match is refused before the agent starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bc.cli.main import cli


@pytest.mark.parametrize(
    ("prefix", "mentions"),
    [
        ("ftp://logs.example/", "must be an http(s) URL with a host"),
        ("https://logs.example/bc/?sig=1", "has a query or fragment"),
        ("https://user@logs.example/bc/", "has user info"),
        ("http://[::1/x", "is not a URL"),
        ("https://logs.example:99999/", "is not a URL"),
        ("https://logs.example/bc/../", "segment"),
    ],
)
def test_a_bad_prefix_is_one_line_and_exit_2(tmp_path: Path, prefix: str, mentions: str) -> None:
    # The data dir holds no identity: a prefix that got past the check would fail on that instead.
    result = CliRunner().invoke(cli, ["node", "--data-dir", str(tmp_path), "--upload-allow", prefix])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --upload-allow") and mentions in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []

"""The upload allowlist: prefixes match parsed, normalized URLs, never text, and refuse what they cannot judge."""

from __future__ import annotations

import re
from urllib.parse import unquote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.kinds.upload_allow import BadUrl, allowed, parse_prefix, parse_prefixes, parse_url

PREFIX = parse_prefixes(["https://logs.example/bc/"])


def allows(url: str, prefixes: tuple[str, ...] = ("https://logs.example/bc/",)) -> bool:
    return allowed(parse_url(url), parse_prefixes(prefixes))


@pytest.mark.parametrize(
    "url",
    [
        "https://logs.example/bc/n1.tar.gz",
        "https://logs.example/bc/n1.tar.gz?X-Amz-Signature=abc",  # the query is not matched
        "https://logs.example/bc/",
        "https://logs.example/bc/deep/er/n1.tar.gz#frag",
        "HTTPS://LOGS.EXAMPLE/bc/n1",  # scheme and host are case-insensitive
        "https://logs.example:443/bc/n1",  # the default port, named
        "https://logs.example./bc/n1",  # a fully qualified name
        "https://uploader@logs.example/bc/n1",  # user info is not the host
    ],
)
def test_what_the_prefix_allows(url: str) -> None:
    assert allows(url)


@pytest.mark.parametrize(
    "url",
    [
        "https://logs.example/bcx",  # a longer name is not below the prefix
        "https://logs.example/bc",  # the prefix says /bc/
        "https://logs.example/BC/n1",  # paths are case-sensitive
        "https://logs.example/%62c/n1",  # another spelling of /bc/ is not guessed at
        "https://logs.example.evil/bc/n1",  # a suffix of the host
        "https://evil.logs.example/bc/n1",  # a subdomain
        "https://logs.example@evil.example/bc/n1",  # the host is evil.example
        "https://logs.example:8443/bc/n1",  # another port
        "http://logs.example/bc/n1",  # another scheme
        "http://logs.example:443/bc/n1",  # http on https's port is still http
    ],
)
def test_what_the_prefix_does_not_allow(url: str) -> None:
    assert not allows(url)


def test_a_prefix_without_a_trailing_slash_allows_itself_and_below_only() -> None:
    prefixes = ("https://logs.example/bc",)
    assert allows("https://logs.example/bc", prefixes)
    assert allows("https://logs.example/bc/n1", prefixes)
    assert not allows("https://logs.example/bcx", prefixes)
    assert not allows("https://logs.example/b", prefixes)


def test_a_host_alone_allows_the_whole_host_and_port() -> None:
    assert allows("https://logs.example/anything", ("https://logs.example",))
    assert allows("https://logs.example", ("https://logs.example/",))
    assert not allows("https://logs.example:444/x", ("https://logs.example",))


def test_addresses_are_compared_as_addresses() -> None:
    assert allows("http://[0:0::1]:8080/up/x", ("http://[::1]:8080/up/",))
    assert allows("http://127.0.0.1:8080/up/x", ("http://127.0.0.1:8080/up/",))
    assert not allows("http://127.0.0.2:8080/up/x", ("http://127.0.0.1:8080/up/",))


def test_no_prefix_allows_nothing() -> None:
    assert not allowed(parse_url("https://logs.example/bc/n1"), ())


@pytest.mark.parametrize(
    ("url", "sentence"),
    [
        ("http://[::1/x", "is not a URL"),  # the URL of issue 10: urlsplit raises
        ("http://127.0.0.1:99999/x", "is not a URL"),  # Python refuses the port as out of range
        ("http://127.0.0.1:0/x", "port 0, outside 1-65535"),
        ("http://127.0.0.1:http/x", "is not a URL"),
        ("ftp://logs.example/x", "must be an http(s) URL with a host"),
        ("https:///x", "must be an http(s) URL with a host"),
        ("https://logs.example/bc/../etc", "'.' or '..' segment"),
        ("https://logs.example/bc/%2e%2E/etc", "'.' or '..' segment"),
        ("https://logs.example/bc/./x", "'.' or '..' segment"),
        ("https://logs.example/bc/..%2fetc", "encoded '/'"),
        ("https://logs.example/bc/%5C..", "encoded '/'"),
        ("https://logs.example/bc\\..\\x", "backslash"),
        ("https://logs.example/bc/ x", "whitespace"),
        ("https://logs.example/bc/\nx", "whitespace"),
        ("https://logs.exämple/bc/x", "non-ASCII"),
    ],
)
def test_urls_that_are_refused_outright(url: str, sentence: str) -> None:
    with pytest.raises(BadUrl, match=re.escape(sentence)):
        parse_url(url)


@pytest.mark.parametrize(
    ("prefix", "sentence"),
    [
        ("https://logs.example/bc/?x=1", "query or fragment"),
        ("https://logs.example/bc/#top", "query or fragment"),
        ("https://logs.example/bc/?", "query or fragment"),
        ("https://user:pw@logs.example/bc/", "user info"),
        ("logs.example/bc/", "http"),
        ("https://logs.example/bc/../", "segment"),
    ],
)
def test_prefixes_that_are_refused(prefix: str, sentence: str) -> None:
    with pytest.raises(BadUrl, match=sentence):
        parse_prefix(prefix)
    with pytest.raises(BadUrl, match="--upload-allow"):
        parse_prefix(prefix)


PIECES = [
    "logs.example",
    "logs",
    ".example",
    ".evil",
    "@",
    ":",
    "443",
    "8443",
    "/",
    "bc",
    "bcx",
    "..",
    ".",
    "%2e",
    "%2f",
    "%5c",
    "%40",
    "\\",
    "?",
    "#",
    "[",
    "]",
    "::1",
    "user",
    "n1.tar.gz",
]


@given(st.lists(st.sampled_from(PIECES), max_size=12).map("".join))
def test_what_is_allowed_is_where_httpx_would_send_it(tail: str) -> None:
    """An independent parser (httpx, which does the upload) agrees: an allowed URL goes to logs.example/bc/."""
    url = "https://" + tail
    try:
        target = parse_url(url)
    except BadUrl:
        return
    if not allowed(target, PREFIX):
        return
    sent = httpx.URL(url)
    assert sent.scheme == "https"
    assert sent.host == "logs.example"
    assert sent.port in (None, 443)
    path = unquote(sent.path)
    assert path.startswith("/bc/"), path
    assert not {".", ".."} & set(path.split("/")), path

"""Where `logs.collect` may upload: the node operator's allowlist, matched on parsed, normalized URLs.

The control plane chooses an upload URL, but only the node's own operator
chooses where node logs may go (`bc node --upload-allow PREFIX`, repeatable).
Nothing the control plane sends can add a prefix, so a compromised control
plane can neither ship the logs elsewhere nor use the node to probe its
network: a URL outside the list is never dialled.

Matching is on the parsed URL, never on its text, so `https://logs.example/bc/`
does not allow `https://logs.example/bcx`, `https://logs.example.evil/` or
`https://logs.example@evil.example/`:

* scheme: equal (`http` or `https`, case-insensitive);
* host: equal, case-insensitive, one trailing dot ignored; IP addresses are
  compared as addresses (`[0:0::1]` is `[::1]`); no subdomain or suffix
  matching;
* port: equal, the scheme's default (80, 443) when the URL names none;
* path: a prefix path ending in `/` allows every path that starts with it; one
  without (`/bc`) allows itself and what lies below it (`/bc/x`), never `/bcx`;
  an empty path is `/` (the whole host). Paths are compared as sent, case and
  percent-encoding included, so an alternative spelling of an allowed path is
  refused rather than guessed at;
* query and fragment: ignored (a pre-signed URL's signature is in its query).

A URL that could name a path outside the one it spells is refused as
`invalid-payload` before any matching: a `.`/`..` segment (plain or
percent-encoded), an encoded `/` or `\\`, a backslash, whitespace, control
or non-ASCII characters. So is one that does not parse, or whose port is
outside 1-65535.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


class BadUrl(ValueError):
    """A URL we refuse to match at all; the message is one sentence for the operator."""


@dataclass(frozen=True)
class UrlParts:
    """A URL reduced to what matching looks at."""

    scheme: str
    host: str
    port: int
    path: str

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def _host(raw: str) -> str:
    host = raw.lower().removesuffix(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _checked_path(path: str, what: str) -> str:
    if "\\" in path:
        raise BadUrl(f"{what} has a backslash in its path")
    for segment in path.split("/"):
        decoded = unquote(segment)
        if decoded in (".", ".."):
            raise BadUrl(f"{what} has a '.' or '..' segment in its path")
        if "/" in decoded or "\\" in decoded:
            raise BadUrl(f"{what} has an encoded '/' or '\\' in its path")
    return path or "/"


def _split(url: str, what: str) -> SplitResult:
    if not url.isascii() or any(c <= " " or c == "\x7f" for c in url):
        raise BadUrl(f"{what} {url!r} has whitespace, control or non-ASCII characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # parsed lazily: a bad port raises only here
    except ValueError as e:
        raise BadUrl(f"{what} {url!r} is not a URL: {e}") from None
    if parts.scheme.lower() not in DEFAULT_PORTS or not parts.hostname:
        raise BadUrl(f"{what} {url!r} must be an http(s) URL with a host")
    if port is not None and not 1 <= port <= 65535:
        raise BadUrl(f"{what} {url!r} has port {port}, outside 1-65535")
    return parts


def parse_url(url: str, what: str = "upload_url") -> UrlParts:
    """The parts of an upload URL; BadUrl (one sentence) for one we refuse to match."""
    parts = _split(url, what)
    scheme = parts.scheme.lower()
    return UrlParts(
        scheme=scheme,
        host=_host(parts.hostname or ""),
        port=parts.port or DEFAULT_PORTS[scheme],
        path=_checked_path(parts.path, what),
    )


def parse_prefix(prefix: str) -> UrlParts:
    """An operator's `--upload-allow` prefix: a URL without user info, query or fragment."""
    what = "--upload-allow"
    parts = _split(prefix, what)
    if parts.username is not None or parts.password is not None:
        raise BadUrl(f"{what} {prefix!r} has user info; name the scheme, host, port and path only")
    if parts.query or parts.fragment or prefix.endswith(("?", "#")):
        raise BadUrl(f"{what} {prefix!r} has a query or fragment; name the scheme, host, port and path only")
    return parse_url(prefix, what)


def parse_prefixes(prefixes: Iterable[str]) -> tuple[UrlParts, ...]:
    return tuple(parse_prefix(p) for p in prefixes)


def path_under(path: str, prefix: str) -> bool:
    if prefix.endswith("/"):
        return path.startswith(prefix)
    return path == prefix or path.startswith(prefix + "/")


def allowed(target: UrlParts, prefixes: Iterable[UrlParts]) -> bool:
    """Whether one of the prefixes allows the target (see the module docstring for the rules)."""
    return any(
        (target.scheme, target.host, target.port) == (p.scheme, p.host, p.port) and path_under(target.path, p.path)
        for p in prefixes
    )

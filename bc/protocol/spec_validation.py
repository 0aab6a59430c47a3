"""What a NodeSpec section may hold, beyond parsing: the checks that run before a spec is stored.

The node writes what a spec says to disk (sysctl drop-ins, module lists, sshd
files, CDI specs) and shows it to operators, so a section is refused as a
whole, with one sentence naming the field, when:

* any string in it, including the keys and strings inside a host unit's
  `settings_json`, holds a control character (C0, DEL, C1), a bidirectional
  override or isolate, or a line/paragraph separator: text that can rewrite a
  file's meaning or a terminal's display is never data;
* a name is not a name: host unit names, instance ids, principals and
  formats are short ASCII tokens (`re.fullmatch`, so no trailing newline), never
  paths;
* `settings_json` is not a JSON object (or nests deeper than `MAX_JSON_DEPTH`),
  or a known unit's settings are bad on any host (`bc.protocol.host_units`);
* URLs are not http(s) URLs with a host; digests are not `sha256` hex;
  numbers are out of their range.

Pure: `check_section(section, message)` raises `SpecError` (a `UsageError`,
exit 2) or returns. The devices section is written by reservations, never by
an operator, and is checked by the reservation code that builds it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from bc.otel import config as otlp_config
from bc.protocol import instance_rules, site_rules, ssh_lines
from bc.protocol.canonical import SpecError
from bc.protocol.host_units import UnitInvalid, check_settings
from bc.protocol.pb import spec_pb2
from bc.protocol.text_safety import unsafe_char

MAX_JSON_DEPTH = 32


UNIT_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
PRINCIPAL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@-]{0,63}")
SERIAL = re.compile(r"[0-9]{1,20}|[0-9a-fA-F]{1,40}")
TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
SHA256_HEX = re.compile(r"(sha256:)?[0-9a-f]{64}")
RELEASE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # as bc.pki.releases.NAME_RE
RELEASE_PLATFORM = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")  # as bc.pki.releases.PLATFORM_RE


def _refuse(section: str, field: str, why: str) -> SpecError:
    return SpecError(f"the {section} section's {field} {why}")


def _check_text(section: str, field: str, text: str) -> None:
    ch = unsafe_char(text)
    if ch is not None:
        raise _refuse(section, field, f"holds the control or bidirectional character U+{ord(ch):04X}")


def _strings(msg: Message, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string in `msg` with the field path that holds it (map keys and values included)."""
    for fd, value in msg.ListFields():
        name = f"{path}{fd.name}"
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                for k, v in value.items():
                    yield f"{name} key", str(k)
                    if isinstance(v, str):
                        yield f"{name}[{k!r}]", v
            elif fd.is_repeated:
                for i, item in enumerate(value):
                    yield from _strings(item, f"{name}[{i}].")
            else:
                yield from _strings(value, f"{name}.")
        elif fd.type == FieldDescriptor.TYPE_STRING:
            items = value if fd.is_repeated else [value]
            for i, item in enumerate(items):
                yield (f"{name}[{i}]" if fd.is_repeated else name), item


def _json_strings(value: Any, depth: int = 0) -> Iterator[str]:
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nests deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _json_strings(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _json_strings(v, depth + 1)


def parse_settings(text: str) -> dict[str, Any]:
    """A host unit's `settings_json`: a JSON object, at most `MAX_JSON_DEPTH` deep; ValueError says why not."""
    try:
        doc = json.loads(text or "{}")
    except RecursionError:
        raise ValueError(f"nests deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"is not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"must be a JSON object, not {type(doc).__name__}")
    for s in _json_strings(doc):
        ch = unsafe_char(s)
        if ch is not None:
            raise ValueError(f"holds the control or bidirectional character U+{ord(ch):04X}")
    return doc


def _check_url(section: str, field: str, url: str) -> None:
    if not url:
        return
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port out of range
    except ValueError as e:
        raise _refuse(section, field, f"is not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _refuse(section, field, f"must be an http or https URL with a host, not {url!r}")
    del port


def _check_name(section: str, field: str, value: str, pattern: re.Pattern[str], what: str) -> None:
    if not pattern.fullmatch(value):
        raise _refuse(section, field, f"{value!r} is not {what}")


def _check_host(s: spec_pb2.HostSection) -> None:
    seen: set[str] = set()
    for i, unit in enumerate(s.units):
        field = f"units[{i}]"
        _check_name("host", f"{field}.name", unit.name, UNIT_NAME, "a unit name (1-63 of a-z 0-9 . _ -)")
        if unit.name in seen:
            raise _refuse("host", f"{field}.name", f"{unit.name!r} appears twice")
        seen.add(unit.name)
        try:
            settings = parse_settings(unit.settings_json)
        except ValueError as e:
            raise _refuse("host", f"{field}.settings_json", str(e)) from None
        try:
            check_settings(unit.name, settings)  # what a known unit's settings may say (bc.protocol.host_units)
        except UnitInvalid as e:
            raise _refuse("host", f"{field}.settings_json", f"is refused ({e})") from None


def _check_instances(s: spec_pb2.InstancesSection) -> None:
    try:
        instance_rules.check_section(s)
    except instance_rules.InstanceRuleError as e:
        raise _refuse("instances", e.field, e.why) from None


def _check_access(s: spec_pb2.AccessSection) -> None:
    for i, p in enumerate(s.principals):
        why = ssh_lines.section_principal_problem(p)
        if why is not None:
            raise _refuse("access", f"principals[{i}]", f"{p!r} {why}")
    for i, serial in enumerate(s.revoked_serials):
        if ssh_lines.parse_serial(serial) is None:
            raise _refuse("access", f"revoked_serials[{i}]", f"{serial!r} is not a certificate serial (decimal)")
    for i, key in enumerate(s.ssh_ca_keys):
        why = ssh_lines.key_line_problem(key)
        if why is not None:
            raise _refuse("access", f"ssh_ca_keys[{i}]", why)


def _check_telemetry(s: spec_pb2.TelemetrySection) -> None:
    _check_url("telemetry", "otlp_endpoint", s.otlp_endpoint)
    if not 0 <= s.export_interval_s <= 86_400:
        raise _refuse("telemetry", "export_interval_s", f"must be between 0 and 86400, not {s.export_interval_s}")
    if s.otlp_endpoint:
        try:  # the node's own rule (bc.otel.config), so a section it would fail never leaves the control plane
            otlp_config.parse(s.otlp_endpoint, s.protocol, s.export_interval_s)
        except otlp_config.BadOtlpConfig as e:
            raise SpecError(f"the telemetry section is refused: {e}") from None
    elif s.protocol:
        raise _refuse("telemetry", "protocol", "is set without an otlp_endpoint")


def _check_daemon(s: spec_pb2.DaemonSection) -> None:
    if s.version:
        _check_name("daemon", "version", s.version, TOKEN, "a version (1-64 of A-Z a-z 0-9 . _ + -)")
    _check_url("daemon", "url", s.url)
    if s.sha256 and not SHA256_HEX.fullmatch(s.sha256):
        raise _refuse("daemon", "sha256", "must be 64 lowercase hex digits")
    if s.name:
        _check_name("daemon", "name", s.name, RELEASE_NAME, "a release name (1-64 of a-z 0-9 . _ -)")
    if s.platform:
        _check_name("daemon", "platform", s.platform, RELEASE_PLATFORM, "a release platform (as linux-x86_64)")


def _check_site(s: spec_pb2.SiteSection) -> None:
    for i, img in enumerate(s.cache_images):
        _check_url("site", f"cache_images[{i}].url", img.url)
        if img.sha256 and not SHA256_HEX.fullmatch(img.sha256):
            raise _refuse("site", f"cache_images[{i}].sha256", "must be 64 lowercase hex digits")
        if img.format:
            _check_name("site", f"cache_images[{i}].format", img.format, TOKEN, "a format name")
    try:
        site_rules.check_section(s)
    except site_rules.SiteRuleError as e:
        raise _refuse("site", e.field, e.why) from None


def check_section(section: str, msg: Message) -> None:
    """Refuse (SpecError, one sentence) a section the node must not be sent; return when it is fine."""
    for field, text in _strings(msg):
        _check_text(section, field, text)
    if isinstance(msg, spec_pb2.HostSection):
        _check_host(msg)
    elif isinstance(msg, spec_pb2.InstancesSection):
        _check_instances(msg)
    elif isinstance(msg, spec_pb2.AccessSection):
        _check_access(msg)
    elif isinstance(msg, spec_pb2.TelemetrySection):
        _check_telemetry(msg)
    elif isinstance(msg, spec_pb2.DaemonSection):
        _check_daemon(msg)
    elif isinstance(msg, spec_pb2.SiteSection):
        _check_site(msg)

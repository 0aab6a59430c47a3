"""`site.httpProxy`: one HTTP request from the site to an agentless machine, never to a BMC.

Destructive (the quorum's: a non-GET must come as a batch leaf bound to its payload) and never retried. The
target check is `agent.site.proxy_rules`, run on the addresses the URL's host resolves to now, with every
BMC host the site drove (`bmc-hosts.json`) or lists, their addresses and the site's `bmc_networks`. The
request then goes to the first allowed address itself (the host kept in `Host` and TLS SNI, the certificate
checked against it), never resolving again, with no redirects followed and no proxy from the environment.
The result: `status`, the response `headers`, and the body (at most 1 MiB: `body` as text when it is
UTF-8, else `body_base64`; `truncated` when it was longer).
"""

from __future__ import annotations

import base64
import logging
import re
from urllib.parse import urlsplit, urlunsplit

import httpx

from agent.kinds.base import InvalidPayload, KindContext, KindResult, TypedExecutor
from agent.site import proxy_rules
from agent.site.bmc_hosts import BmcHostsError
from agent.site.state import SiteState
from bc.protocol import site_rules
from bc.protocol.pb import site_kinds_pb2 as pb

log = logging.getLogger(__name__)

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
HEADER_VALUE = re.compile(r"[\x20-\x7e]{0,4096}")
NO_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
MAX_BODY = 1 << 20
PROXY_FAILED = "proxy-failed"


class SiteHttpProxy(TypedExecutor[pb.SiteHttpProxyRequest]):
    name = "site.httpProxy"
    request_type = pb.SiteHttpProxyRequest

    def __init__(self, site: SiteState, timeout_s: float = 30.0) -> None:
        self.site = site
        self.timeout_s = timeout_s

    def validate(self, request: pb.SiteHttpProxyRequest) -> None:
        if not site_rules.MACHINE_NAME.fullmatch(request.target_node_id):
            raise InvalidPayload("target_node_id is not a node id")
        if (request.method or "GET") not in METHODS:
            raise InvalidPayload(f"method must be one of {', '.join(METHODS)}")
        if len(request.body) > MAX_BODY:
            raise InvalidPayload("body is over 1 MiB")
        for k, v in request.headers.items():
            if not HEADER_NAME.fullmatch(k) or not HEADER_VALUE.fullmatch(v) or k.lower() in NO_HEADERS:
                raise InvalidPayload(f"header {k!r} is not one the proxy sends")
        try:
            proxy_rules.url_host(request.url)
        except proxy_rules.Forbidden as e:
            raise InvalidPayload(e.why) from None

    async def execute(self, ctx: KindContext, request: pb.SiteHttpProxyRequest) -> KindResult:
        method = request.method or "GET"
        host = proxy_rules.url_host(request.url)
        try:
            addrs = proxy_rules.allowed(
                request.url,
                request.target_node_id,
                list(self.site.section.proxy_targets),
                await self.site.offload(self.site.bmc_hosts.hosts)
                | {site_rules.bmc_host(m.bmc_url) for m in self.site.section.machines},
                await self.site.bmc_addresses(),
                self.site.options.bmc_networks,
                await self.site.resolve(host.strip("[]")),
            )
        except (proxy_rules.Forbidden, BmcHostsError) as e:
            why = e.why if isinstance(e, proxy_rules.Forbidden) else str(e)
            log.warning("event=site.proxy.forbidden target=%s url=%r why=%r", request.target_node_id, request.url, why)
            return KindResult.failure(proxy_rules.FORBIDDEN_TARGET, why)
        parts = urlsplit(request.url)
        ip = addrs[0]
        netloc = f"[{ip}]" if ":" in ip else ip
        if parts.port is not None:
            netloc += f":{parts.port}"
        pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        headers = dict(request.headers)
        headers["Host"] = parts.netloc.rsplit("@", 1)[-1]
        body = b""
        truncated = False
        try:
            async with (
                httpx.AsyncClient(timeout=self.timeout_s, trust_env=False, follow_redirects=False) as client,
                client.stream(
                    method,
                    pinned,
                    headers=headers,
                    content=request.body or None,
                    extensions={"sni_hostname": host.strip("[]")},
                ) as resp,
            ):
                async for chunk in resp.aiter_bytes():  # read no more than the result may hold
                    body += chunk
                    if len(body) > MAX_BODY:
                        body, truncated = body[:MAX_BODY], True
                        break
        except httpx.HTTPError as e:
            return KindResult.failure(PROXY_FAILED, f"{type(e).__name__}: {e}"[:300])
        result: dict[str, object] = {
            "status": resp.status_code,
            "headers": {k.lower(): v for k, v in resp.headers.items()},
            "truncated": truncated,
        }
        try:
            result["body"] = body.decode("utf-8")
        except UnicodeDecodeError:
            result["body_base64"] = base64.b64encode(body).decode()
        log.info("event=site.proxy target=%s method=%s status=%d", request.target_node_id, method, resp.status_code)
        return KindResult.success(result, f"{method} {resp.status_code}")

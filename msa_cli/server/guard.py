"""What every request meets before a route: the access log, the cap on requests at once, and
the checks that keep web pages out.

A browser lets any page send a "simple" POST (text/plain, no preflight) to any address, the
user's loopback included, and DNS rebinding lets a page read the answers under a name of its
own. So: the Host must name this server when it listens on loopback (a rebound name does not),
a request from a browser origin that the user did not list (`--allow-origin`) is refused, and
POSTs must say they are JSON (which no simple cross-origin request may). Listed origins get
CORS: preflight answered, their responses readable.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import time

from .chat_request import ApiError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
RETRY_AFTER_S = 2  # what a refused client is told to wait (Retry-After) before trying again


def host_name(host: str) -> str:
    """The name in a Host header, without its port: "[::1]:8000" -> "::1"."""
    if host.startswith("["):
        return host[1:].partition("]")[0].lower()
    return (host.rpartition(":")[0] if host.count(":") == 1 else host).lower()


def allowed_hosts(bind_host: str) -> frozenset[str] | None:
    """The Host names a server on `bind_host` answers: on loopback, this machine's own names
    only (a DNS-rebound name is refused); elsewhere any (the API key guards it)."""
    name = host_name(bind_host)
    return LOOPBACK_NAMES | {name} if is_loopback(name) else None


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Guard:
    """ASGI middleware around the application. `hosts`: the Host names accepted (None: any);
    `origins`: the browser origins allowed; `max_requests`: requests handled at once, bodies
    being read included (past it: 503 with Retry-After)."""

    def __init__(self, app, *, hosts, origins, max_requests: int, log):
        self.app, self.hosts, self.origins = app, hosts, frozenset(origins)
        self.max_requests, self.log = max_requests, log
        self.active = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), 0

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refusal = self._refusal(dict(scope["headers"]))
            if refusal is not None:
                return await error_response(refusal, send_and_note)
            self.active += 1
            try:
                await self.app(scope, receive, send_and_note)
            finally:
                self.active -= 1
        except Exception:  # answered (500) by Starlette's outermost layer, after this one
            status = status or 500
            raise
        finally:
            self._access_log(scope, status or 499, time.perf_counter() - start)

    def _refusal(self, headers: dict[bytes, bytes]) -> ApiError | None:
        host = headers.get(b"host", b"").decode("latin-1")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return ApiError(
                403,
                "this server answers only requests for its own address (the Host header "
                "names another: a DNS-rebinding page?)",
                code="host_not_allowed",
            )
        origin = headers.get(b"origin")
        if origin is not None and not ({"*", origin.decode("latin-1")} & self.origins):
            return ApiError(
                403,
                "requests from web pages are refused unless their origin is allowed "
                "(msa serve --allow-origin ORIGIN)",
                code="origin_not_allowed",
            )
        if self.active >= self.max_requests:
            return ApiError(
                503,
                f"the server is handling {self.max_requests} requests, its limit "
                "(msa serve --max-concurrent-requests): try again later",
                kind="server_error",
                code="too_many_requests",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return None

    def _access_log(self, scope, status: int, seconds: float) -> None:
        # the raw path, escaped: never the query, a header (the key) or the body
        raw = (scope.get("raw_path") or scope["path"].encode()).partition(b"?")[0]
        path = "".join(chr(b) if 0x21 <= b < 0x7F else f"\\x{b:02x}" for b in raw)
        client = scope.get("client") or ("-", 0)
        print(
            f"msa serve: {client[0]} {scope['method']} {path} {status} {seconds:.3f}s",
            file=self.log or sys.stderr,
            flush=True,
        )


async def error_response(error: ApiError, send) -> None:
    """Answer `error` in OpenAI's shape, straight on the ASGI connection."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

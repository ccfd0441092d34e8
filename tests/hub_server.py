"""A Hugging Face hub stand-in on loopback, for `msa pull` tests: never the real network.

It answers the few routes huggingface-hub uses to download a repository (repository info, the
file tree, HEAD and GET of `resolve/` with byte ranges), logs every request, and can cut a
download short once (`cut`), to test resuming, or hang in the middle of one (`stall`) while
the test interrupts the pull.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, bytes]

    @property
    def commit(self) -> str:
        h = hashlib.sha1()
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + self.files[name])
        return h.hexdigest()

    def etag(self, name: str) -> str:
        return hashlib.sha256(self.files[name]).hexdigest()


@dataclass
class Request:
    method: str
    path: str
    range: str | None


@dataclass
class FakeHub:
    repos: dict[str, HubRepo] = field(default_factory=dict)
    log: list[Request] = field(default_factory=list)
    cut: dict[str, int] = field(
        default_factory=dict
    )  # file -> bytes sent before the next full GET is cut
    stall: dict[str, int] = field(
        default_factory=dict
    )  # file -> bytes sent before its GETs hang until `release`
    stalled: threading.Event = field(
        default_factory=threading.Event
    )  # set once a stalled GET hangs
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def add(self, repo_id: str, files: dict[str, bytes]) -> HubRepo:
        self.repos[repo_id] = HubRepo(repo_id, files)
        return self.repos[repo_id]

    def gets(self, filename: str) -> list[Request]:
        return [
            r
            for r in self.log
            if r.method == "GET" and r.path.endswith("/" + filename) and "/resolve/" in r.path
        ]


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(/.*)?$")


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_HEAD(self):
            self._answer(head=True)

        def do_GET(self):
            self._answer(head=False)

        def _json(self, obj, status=200, headers=()):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _not_found(self, code="RepoNotFound"):
            self._json({"error": "Repository not found"}, 404, [("X-Error-Code", code)])

        def _answer(self, head: bool):
            path = unquote(urlparse(self.path).path)
            hub.log.append(Request(self.command, path, self.headers.get("Range")))
            if m := _TREE.match(path):
                repo = hub.repos.get(m["repo"])
                if repo is None:
                    return self._not_found()
                return self._json(
                    [
                        {"type": "file", "oid": repo.etag(n)[:40], "size": len(data), "path": n}
                        for n, data in sorted(repo.files.items())
                    ]
                )
            if m := _INFO.match(path):
                repo = hub.repos.get(m["repo"])
                if repo is None:
                    return self._not_found()
                return self._json(
                    {
                        "id": repo.repo_id,
                        "modelId": repo.repo_id,
                        "sha": repo.commit,
                        "private": False,
                        "siblings": [{"rfilename": n} for n in sorted(repo.files)],
                    }
                )
            m = _RESOLVE.match(path)
            repo = hub.repos.get(m["repo"]) if m else None
            if repo is None:
                return self._not_found()
            name = m["file"]
            if name not in repo.files:
                return self._json(
                    {"error": "Entry not found"},
                    404,
                    [("X-Error-Code", "EntryNotFound"), ("X-Repo-Commit", repo.commit)],
                )
            data = repo.files[name]
            start = 0
            if (rng := self.headers.get("Range")) and (r := re.match(r"bytes=(\d+)-", rng)):
                start = int(r[1])
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{repo.etag(name)}"')
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if head:
                return
            if not start and name in hub.cut:
                self.wfile.write(data[: hub.cut.pop(name)])
                self.wfile.flush()
                self.close_connection = True
                return
            if name in hub.stall and not hub.release.is_set():
                # the first bytes, then a hang; a retry (after the client's read timeout, which
                # a loaded machine can reach before the test's Ctrl-C) hangs at once, until
                # `release`
                self.wfile.write(data[start : max(start, hub.stall[name])])
                self.wfile.flush()
                hub.stalled.set()
                hub.release.wait(120)
                self.close_connection = True
                return
            self.wfile.write(data[start:])

    return Handler


class serve_hub:
    """`with serve_hub(hub) as url:` runs `hub` on 127.0.0.1 for the block."""

    def __init__(self, hub: FakeHub):
        self.hub = hub

    def __enter__(self) -> str:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.hub))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.hub.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self.hub.url

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

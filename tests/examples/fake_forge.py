"""A small fake of the GitHub and GitLab comment APIs on loopback, for the CI preview script.

Only the calls `examples/ci/preview-pr.py` makes, paged like the real ones (`per_page`, `page`):

- GitHub: GET/POST `/repos/{owner}/{repo}/issues/{number}/comments`,
  PATCH `/repos/{owner}/{repo}/issues/comments/{id}`, with `Authorization: Bearer <token>`;
- GitLab: GET/POST `/api/v4/projects/{id}/merge_requests/{iid}/notes`, PUT `.../notes/{id}`,
  with `PRIVATE-TOKEN: <token>`.

Every request is recorded; a request without the expected token gets 401, an unknown route 404.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "t0ken-for-tests"

_GITHUB_LIST = re.compile(r"^/repos/(?P<repo>[^/]+/[^/]+)/issues/(?P<thread>\d+)/comments$")
_GITHUB_ITEM = re.compile(r"^/repos/(?P<repo>[^/]+/[^/]+)/issues/comments/(?P<id>\d+)$")
_GITLAB_LIST = re.compile(r"^/api/v4/projects/(?P<repo>[^/]+)/merge_requests/(?P<thread>\d+)/notes$")
_GITLAB_ITEM = re.compile(r"^/api/v4/projects/(?P<repo>[^/]+)/merge_requests/\d+/notes/(?P<id>\d+)$")


@dataclass
class Forge:
    """The comments of every thread, keyed by (repo, thread number), and the requests seen."""

    url: str = ""
    comments: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    _next_id: int = 1000
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def seed(self, repo: str, thread: int, bodies: list[str]) -> None:
        """Comments other people wrote before the script ran."""
        for body in bodies:
            self._add(repo, str(thread), body, author="someone")

    def thread(self, repo: str, thread: int) -> list[dict[str, Any]]:
        return self.comments.get((repo, str(thread)), [])

    def _add(self, repo: str, thread: str, body: str, *, author: str) -> dict[str, Any]:
        self._next_id += 1
        comment = {"id": self._next_id, "body": body, "user": {"login": author}}
        self.comments.setdefault((repo, thread), []).append(comment)
        return comment

    def _find(self, comment_id: str) -> dict[str, Any] | None:
        for comments in self.comments.values():
            for comment in comments:
                if str(comment["id"]) == comment_id:
                    return comment
        return None

    def handle(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        split = urlsplit(path)
        with self._lock:
            self.requests.append((method, path))
            github = split.path.startswith("/repos/")
            token = headers.get("Authorization") if github else headers.get("PRIVATE-TOKEN")
            if token != (f"Bearer {TOKEN}" if github else TOKEN):
                return 401, {"message": "Bad credentials"}
            lister = (_GITHUB_LIST if github else _GITLAB_LIST).match(split.path)
            item = (_GITHUB_ITEM if github else _GITLAB_ITEM).match(split.path)
            if lister and method == "GET":
                query = parse_qs(split.query)
                per_page = int(query.get("per_page", ["30"])[0])
                page = int(query.get("page", ["1"])[0])
                comments = self.thread(lister["repo"], int(lister["thread"]))
                return 200, comments[(page - 1) * per_page : page * per_page]
            if lister and method == "POST":
                text = json.loads(body)["body"]
                return 201, self._add(lister["repo"], lister["thread"], text, author="ci-bot")
            if item and method == ("PATCH" if github else "PUT"):
                comment = self._find(item["id"])
                if comment is None:
                    return 404, {"message": "Not Found"}
                comment["body"] = json.loads(body)["body"]
                return 200, comment
            return 404, {"message": "Not Found"}


@contextmanager
def serve_forge() -> Iterator[Forge]:
    """Serve a fresh `Forge` on 127.0.0.1 (a free port) for the duration of the block."""
    forge = Forge()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            status, payload = forge.handle(self.command, self.path, self.headers, self.rfile.read(length))
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = _answer

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    forge.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-forge", daemon=True)
    thread.start()
    try:
        yield forge
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

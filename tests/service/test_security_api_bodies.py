"""Security: request bodies are bounded, and read only for a known client (a live uvicorn on 127.0.0.1).

Raw sockets send what an attacker would: a chunked body with no Content-Length, a Content-Length larger than
the limit followed by nothing, a body without a token. The server must answer without waiting for the rest
(each socket read has a timeout, so a server that waits fails the test instead of hanging it).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.service.conftest import ApiFactory, auth, healthy_inventory

LIMIT = 65536  # the documented default
READ_TIMEOUT = 10.0


@pytest.fixture
def store_kind() -> str:
    return "memory"  # bodies are the app's concern, not the store's


def _raw(url: str, head: str, body: bytes = b"") -> tuple[int, dict[str, str], dict[str, object]]:
    """Send a request head (and maybe part of a body) and read the answer without sending the rest."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=READ_TIMEOUT) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < _expected(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head_text, _, rest = data.partition(b"\r\n\r\n")
    lines = head_text.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(rest)


def _expected(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(data) + 1


def _head(*, length: int | None = None, token: str | None = "token-a", path: str = "/v1/leases") -> str:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    return "\n".join(lines) + "\n"


def _chunks(total: int, size: int = 8192) -> Iterator[bytes]:
    yield b'{"target": "example.com"'
    sent = 0
    while sent < total:
        piece = min(size, total - sent)
        yield b" " * piece
        sent += piece
    yield b"}"


def test_a_chunked_body_past_the_limit_is_a_413(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["p1"]))
    with api.client() as client:
        answer = client.post(
            "/v1/leases",
            content=_chunks(LIMIT + 10_000),
            headers={**auth("crawler-a"), "Content-Type": "application/json"},
        )
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"] == "body_too_large"
    assert "65536 bytes" in answer.json()["detail"]


def test_a_chunked_body_within_the_limit_is_served(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["p1"]))
    with api.client() as client:
        answer = client.post(
            "/v1/leases",
            content=_chunks(LIMIT - 1000),
            headers={**auth("crawler-a"), "Content-Type": "application/json"},
        )
    assert answer.status_code == 200, answer.text


def test_a_declared_length_past_the_limit_is_refused_before_the_body(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["p1"]))
    status, headers, body = _raw(api.url, _head(length=10_000_000), b"{")  # the rest never comes
    assert (status, body["error"]) == (413, "body_too_large")
    assert headers["x-request-id"] == body["requestId"]


def test_a_body_without_a_token_is_refused_before_it_is_read(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["p1"]))
    for path in ("/v1/leases", "/v1/reports", "/v1/nowhere"):
        status, headers, body = _raw(api.url, _head(token=None, path=path))  # chunked, no chunk sent
        assert (status, body["error"]) == (401, "unauthorized"), path
        assert headers["www-authenticate"].startswith("Bearer")


def test_a_body_with_an_unknown_token_is_refused_before_it_is_read(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["p1"]))
    status, headers, body = _raw(api.url, _head(length=100, token="not-a-token"), b"{")
    assert (status, body["error"]) == (401, "unauthorized")
    assert 'error="invalid_token"' in headers["www-authenticate"]


def test_the_limit_is_a_setting(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["p1"]), max_body_bytes=2048)
    with api.client() as client:
        headers = {**auth("crawler-a"), "Content-Type": "application/json"}
        big = client.post("/v1/leases", content=b" " * 3000 + b"{}", headers=headers)
        small = client.post("/v1/leases", content=b" " * 1000 + b"{}", headers=headers)
    assert big.status_code == 413
    assert small.status_code == 200, small.text


def test_labels_are_bounded_with_a_422_that_says_so(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["p1"]))
    labels = {f"k{i}": "v" for i in range(33)}
    with api.client() as client:
        answer = client.post("/v1/leases", json={"labels": labels}, headers=auth("crawler-a"))
        fine = client.post(
            "/v1/leases", json={"labels": dict(list(labels.items())[:32])}, headers=auth("crawler-a")
        )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid_request"
    assert answer.json()["detail"][0]["field"] == "body.labels"
    assert fine.status_code == 503  # valid, and no proxy carries those labels


@pytest.mark.parametrize(
    "content",
    [b"[" * 30000 + b"]" * 30000, b'{"labels": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001, b"\xff\xfe"],
)
def test_hostile_json_within_the_limit_is_a_4xx_never_a_500(start_api: ApiFactory, content: bytes) -> None:
    api = start_api(inventory=healthy_inventory(["p1"]))
    with api.client() as client:
        for path in ("/v1/leases", "/v1/reports"):
            answer = client.post(
                path, content=content, headers={**auth("crawler-a"), "Content-Type": "application/json"}
            )
            assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text)
            assert "error" in answer.json()


def test_a_request_without_a_body_still_reaches_the_route(start_api: ApiFactory) -> None:
    api = start_api(inventory=healthy_inventory(["p1"]))
    with httpx.Client(base_url=api.url) as client:
        assert client.put("/v1/leases").status_code == 405  # no body: FastAPI answers as before
        assert client.post("/v1/leases").status_code == 401
        assert client.get("/v1/echo").status_code == 200

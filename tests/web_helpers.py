"""Shared pieces of the web tests: a tiny checkpoint saved by the real checkpoint code, a server on a
free loopback port, and raw HTTP requests (so tests control every header byte)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import torch

from glm53_flash import GLM53Flash

from glm53_flash import ModelConfig
from glm53_flash.train.checkpoint import save_checkpoint
from glm53_flash.web.playground import Playground
from glm53_flash.web.server import TOKEN_HEADER, start_server

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"


def tiny_checkpoint(directory: Path) -> Path:
    """A random-init tiny model whose context fits the task prompts, saved as a real checkpoint."""
    torch.manual_seed(0)
    model = GLM53Flash(ModelConfig.preset("tiny", max_sequence_length=192))
    save_checkpoint(directory, model, {"step": 0, "note": "random init, for tests"})
    return directory


def serve(deck_html: str, notes: Path, checkpoint: Path | None, per_minute: int = 100, **limits):
    """A server on a free loopback port; `limits`: max_connections, header_timeout, body_timeout, ..."""
    server, _ = start_server("127.0.0.1", 0, deck_html=deck_html, notes_dir=notes,
                             playground=Playground(checkpoint, per_minute=per_minute), **limits)
    return server


def stop(server) -> None:
    server.shutdown()
    server.server_close()


def raw_reply(server, data: bytes, half_close: bool = False) -> bytes:
    """Send bytes exactly as given; return everything the server sends until it closes."""
    with socket.create_connection(server.server_address[:2], timeout=20) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def parse_reply(reply: bytes) -> tuple[int, dict[str, list[str]], bytes]:
    """(status, headers by lower-case name, body) of one HTTP/1.1 response."""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    if headers.get("transfer-encoding") == ["chunked"]:
        body = dechunk(body)
    return int(lines[0].split(" ", 2)[1]), headers, body


def dechunk(data: bytes) -> bytes:
    """The payload of a chunked body (a streamed answer has no Content-Length)."""
    out = []
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(data[:size])
        data = data[size + 2:]
    return b"".join(out)


def raw(server, data: bytes, half_close: bool = False) -> tuple[int, bytes]:
    """Send bytes exactly as given; return (status, body)."""
    status, _, body = parse_reply(raw_reply(server, data, half_close))
    return status, body


def request_bytes(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                  token: bool = True, host: str | None = None) -> bytes:
    """A request as bytes. token=True sends the launch token in its header (every route needs it)."""
    port = server.server_address[1]
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}", "Connection: close"]
    fields = {}
    if body is not None:
        fields["Content-Type"] = "application/json"
        fields["Content-Length"] = str(len(body))
    if token:
        fields[TOKEN_HEADER] = server.token
    fields.update(headers or {})
    lines += [f"{k}: {v}" for k, v in fields.items() if v is not None]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def request(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            token: bool = True, host: str | None = None) -> tuple[int, bytes]:
    return raw(server, request_bytes(server, method, path, body, headers, token, host))


def post_json(server, path: str, payload, **kw) -> tuple[int, bytes]:
    return request(server, "POST", path, json.dumps(payload).encode(), **kw)

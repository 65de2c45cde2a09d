"""Shared pieces of the web tests: a tiny checkpoint saved by the real checkpoint code, a server on a
free loopback port, and raw HTTP requests (so tests control every header byte)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import torch

from glm53_flash import GLM53Flash, ModelConfig
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


def serve(deck_html: str, notes: Path, checkpoint: Path | None, per_minute: int = 100):
    server, _ = start_server("127.0.0.1", 0, deck_html=deck_html, notes_dir=notes,
                             playground=Playground(checkpoint, per_minute=per_minute))
    return server


def stop(server) -> None:
    server.shutdown()
    server.server_close()


def raw(server, data: bytes, half_close: bool = False) -> tuple[int, bytes]:
    """Send bytes exactly as given; return (status, body)."""
    with socket.create_connection(server.server_address[:2], timeout=20) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    reply = b"".join(chunks)
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def request(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            token: bool = True, host: str | None = None) -> tuple[int, bytes]:
    port = server.server_address[1]
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}", "Connection: close"]
    fields = {}
    if body is not None:
        fields["Content-Type"] = "application/json"
        fields["Content-Length"] = str(len(body))
    if token and method == "POST":
        fields[TOKEN_HEADER] = server.token
    fields.update(headers or {})
    lines += [f"{k}: {v}" for k, v in fields.items() if v is not None]
    return raw(server, ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))


def post_json(server, path: str, payload, **kw) -> tuple[int, bytes]:
    return request(server, "POST", path, json.dumps(payload).encode(), **kw)

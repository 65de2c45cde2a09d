"""`glm53 serve`: one local server for the course deck, its notes and the live playground.

Fixes the original slide server's holes (reference section 8.4): it serves a fixed table of routes
from memory, never a directory (so there is no listing, no path traversal and the notes files can
never be fetched); every request must name this server in its Host header (DNS rebinding); a write
must carry the per-run token embedded in the served pages, a JSON content type and, when the
browser sends one, this server's own Origin (cross-site writes answer 403); request bodies must
state a Content-Length within a fixed bound; and generation is rate limited.
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from ..report.slides import TOKEN_PLACEHOLDER
from .notes import NoteError, NotesStore
from .playground import Playground, PlaygroundError

MAX_BODY_BYTES = 1_000_000
TOKEN_HEADER = "X-GLM53-Token"
ASSETS = Path(__file__).resolve().parent / "assets"
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Content-Security-Policy": ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
                                "frame-ancestors 'none'"),
}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RequestRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SlideServer(ThreadingHTTPServer):
    """The HTTP server plus what its handlers share: the pages, the token, the notes, the playground."""

    daemon_threads = True

    def __init__(self, host: str, port: int, *, deck_html: str, notes_dir: str | Path,
                 playground: Playground, allow_remote: bool = False, allowed_hosts: tuple[str, ...] = ()) -> None:
        if not is_loopback(host) and not allow_remote:
            raise ValueError(f"--host {host} is not a loopback address; binding to it exposes the notes and the "
                             f"playground to the network, so it needs --allow-remote")
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.playground = playground  # before binding: a failed bind calls server_close, which closes it
        super().__init__((host, port), Handler)
        self.token = secrets.token_urlsafe(24)
        self.notes = NotesStore(notes_dir)
        self.refusals: Counter[int] = Counter()  # refused requests by status, for the operator and tests
        bound_port = self.server_address[1]
        # a wildcard bind has no name of its own: the names clients may use come from --allowed-host
        names = {"127.0.0.1", "localhost", "[::1]", host if ":" not in host else f"[{host}]"}
        self.allowed_hosts = {f"{name}:{bound_port}" for name in names} | set(allowed_hosts)
        self.allowed_origins = {f"http://{h}" for h in self.allowed_hosts}
        self.pages = {
            "/": deck_html.replace(TOKEN_PLACEHOLDER, self.token),
            "/playground": (ASSETS / "playground.html").read_text().replace(TOKEN_PLACEHOLDER, self.token),
        }

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = host if ":" not in host else f"[{host}]"
        return f"http://{shown}:{port}/"

    def server_close(self) -> None:
        super().server_close()
        self.playground.close()


class Handler(BaseHTTPRequestHandler):
    server: SlideServer
    server_version = "glm53-serve"
    sys_version = ""
    timeout = 30  # a client that stops sending mid-body cannot hold a thread forever

    # ------------------------------------------------------------------ plumbing
    def log_message(self, format: str, *args) -> None:
        if getattr(self.server, "verbose", False):
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, content_type: str, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in {**SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json; charset=utf-8")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _path(self) -> str:
        return urlsplit(self.path).path

    def _check_host(self) -> None:
        host = self.headers.get("Host", "")
        if host not in self.server.allowed_hosts:
            raise RequestRefused(403, f"Host {host!r} is not this server")

    def _check_write(self) -> None:
        """A write must come from a page this server served: same origin, JSON, the run's token."""
        origin = self.headers.get("Origin")
        if origin is not None and origin not in self.server.allowed_origins:
            raise RequestRefused(403, f"cross-origin write refused (Origin {origin!r})")
        fetch_site = self.headers.get("Sec-Fetch-Site")
        if fetch_site is not None and fetch_site not in ("same-origin", "none"):
            raise RequestRefused(403, f"cross-site write refused (Sec-Fetch-Site {fetch_site!r})")
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise RequestRefused(403, "writes must be sent as application/json")
        token = self.headers.get(TOKEN_HEADER, "")
        if not secrets.compare_digest(token.encode(), self.server.token.encode()):
            raise RequestRefused(403, f"missing or wrong {TOKEN_HEADER}; reload the page from this server")

    def _read_json(self):
        if self.headers.get("Transfer-Encoding") is not None:
            raise RequestRefused(400, "Transfer-Encoding is not accepted; send a Content-Length")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise RequestRefused(411, "a Content-Length header is required")
        if len(lengths) > 1:
            raise RequestRefused(400, "more than one Content-Length header")
        raw = lengths[0].strip()
        if not re.fullmatch(r"[0-9]{1,12}", raw):  # ASCII digits only: str.isdigit() accepts '²'
            raise RequestRefused(400, f"bad Content-Length {raw[:40]!r}")
        length = int(raw)
        if length > MAX_BODY_BYTES:
            raise RequestRefused(413, f"body of {length} bytes is over the limit of {MAX_BODY_BYTES}")
        data = self.rfile.read(length)
        if len(data) != length:
            raise RequestRefused(400, "the body is shorter than its Content-Length")
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise RequestRefused(400, "the body is not valid UTF-8 JSON (or nests too deeply)") from None

    def _guarded(self, action) -> None:
        try:
            self._check_host()
            action()
        except RequestRefused as refused:
            self.close_connection = True  # an unread body must not be parsed as the next request
            self.server.refusals[refused.status] += 1
            self._error(refused.status, str(refused))
        except Exception as error:  # noqa: BLE001 - any other failure still gets an answer, and nothing was written
            self.close_connection = True
            self.server.refusals[500] += 1
            self._error(500, f"internal error: {type(error).__name__}")

    # ------------------------------------------------------------------ routes
    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_HEAD(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def _not_allowed(self) -> None:
        def refuse() -> None:
            raise RequestRefused(405, f"method {self.command} is not allowed")

        self._guarded(refuse)

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _get(self) -> None:
        path = self._path()
        if path in self.server.pages:
            self._send(200, self.server.pages[path].encode(), "text/html; charset=utf-8")
        elif path == "/api/feedback":
            self._json(200, self.server.notes.read("feedback"))
        elif path == "/api/text-edits":
            self._json(200, self.server.notes.read("text-edits"))
        elif path == "/api/playground":
            self._json(200, self.server.playground.describe())
        else:
            self._error(404, "not found")

    def _post(self) -> None:
        path = self._path()
        routes = {"/api/feedback": "feedback", "/api/text-edits": "text-edits"}
        if path not in routes and path != "/api/generate":
            raise RequestRefused(404, "not found")
        self._check_write()
        body = self._read_json()
        if path == "/api/generate":
            self._generate(body)
            return
        try:
            self._json(200, self.server.notes.write(routes[path], body))
        except NoteError as error:
            raise RequestRefused(400, str(error)) from None

    def _generate(self, body) -> None:
        playground = self.server.playground
        try:
            request = playground.prepare(body)
            playground.acquire()
        except PlaygroundError as error:
            raise RequestRefused(error.status, str(error)) from None
        except ValueError as error:  # e.g. an unknown task id
            raise RequestRefused(400, str(error)) from None
        try:
            # Newline-delimited JSON, one event per line, flushed as each token is decided.
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson; charset=utf-8")
            self.send_header("Cache-Control", "no-store")
            for name, value in SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            self.close_connection = True
            try:
                for event in playground.run(request):
                    self.wfile.write(json.dumps(event).encode() + b"\n")
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return  # the page went away; stop generating
            except Exception as error:  # noqa: BLE001 (reported on the stream the page reads, then it ends)
                self.wfile.write(json.dumps({"type": "error", "error": f"{type(error).__name__}: {error}"}).encode()
                                 + b"\n")
        finally:
            playground.release()


def start_server(host: str, port: int, *, deck_html: str, notes_dir: str | Path, playground: Playground,
                 allow_remote: bool = False, allowed_hosts: tuple[str, ...] = ()) -> tuple[SlideServer, threading.Thread]:
    """Bind and serve on a background thread (tests and `glm53 serve` use this)."""
    server = SlideServer(host, port, deck_html=deck_html, notes_dir=notes_dir, playground=playground,
                         allow_remote=allow_remote, allowed_hosts=allowed_hosts)
    thread = threading.Thread(target=server.serve_forever, name="glm53-serve", daemon=True)
    thread.start()
    return server, thread

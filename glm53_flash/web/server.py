"""`glm53 serve`: one local server for the course deck, its notes and the live playground.

Starlette answers the requests and uvicorn (its h11 protocol) speaks HTTP. What the server holds to:

- a fixed table of routes served from memory, never a directory: no listing, no path traversal, and
  the notes files can never be fetched;
- every request must name this server in its Host header (DNS rebinding);
- every request, read or write, must carry the per-launch token (Jupyter's convention): the printed
  URL holds it as `?token=...`, a page opened with it sets an HttpOnly, SameSite=Strict cookie, and
  later requests from that browser carry the cookie; a request with neither answers 403;
- a write must also carry the token in the `X-GLM53-Token` header (the served pages embed it), a
  JSON content type and, when the browser sends one, this server's own Origin;
- request bodies must state a Content-Length within a fixed bound;
- request headers and bodies must arrive within deadlines, and at most `max_connections`
  connections are open at once, so slow clients cannot hold the server;
- a client that goes away mid-request is not an error: nothing is logged;
- Ctrl-C stops the server in order and without a traceback: a running generation ends at its next
  token, a request body still arriving is answered 503, the rest get SHUTDOWN_GRACE seconds;
- generation runs one at a time and is rate limited.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import signal
import socket
import threading
from collections import Counter
from http import HTTPStatus
from pathlib import Path

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from glm53_flash.report.page_policy import content_security_policy
from glm53_flash.report.slides import TOKEN_PLACEHOLDER, deck_policy
from glm53_flash.web import BODY_TIMEOUT, HEADER_TIMEOUT, KEEP_ALIVE_TIMEOUT, MAX_CONNECTIONS
from glm53_flash.web.notes import NoteError, NotesStore
from glm53_flash.web.playground import Playground, PlaygroundError

MAX_BODY_BYTES = 1_000_000
MAX_HEAD_BYTES = 16_384  # request line + headers; larger heads answer 431
H11_BUFFER_BYTES = 65_536  # h11 gives up (400) on an unfinished head larger than this
SHUTDOWN_GRACE = 5.0  # seconds a stopping server gives the requests in flight before cancelling them
TOKEN_HEADER = "X-GLM53-Token"
TOKEN_QUERY = "token"
COOKIE_PREFIX = "glm53-token-"  # + the port: two servers on one host keep their own cookies
ALLOWED_METHODS = ("GET", "HEAD", "POST")
ASSETS = Path(__file__).resolve().parent / "assets"
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
    # Every response: no script or style at all. A page replaces it with its own policy, which allows
    # exactly its own script and stylesheet (page_policies).
    "Content-Security-Policy": content_security_policy(),
}
_SECURITY_HEADER_BYTES = [(name.lower().encode(), value.encode()) for name, value in SECURITY_HEADERS.items()]
log = logging.getLogger(__name__)


def playground_policy(page: str) -> str:
    """The playground page's content security policy: the script and the style element of its asset
    file, nothing inline else."""
    scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    styles = re.findall(r"<style>(.*?)</style>", page, flags=re.S)
    return content_security_policy(scripts, styles)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_text(document) -> bool:
    """Whether every string of a parsed JSON document (keys too) is text that UTF-8 can store: JSON's
    backslash-u escapes (such as \\ud800) can spell a lone surrogate, which json.loads accepts and no
    file can hold."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return True


class RequestRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _ClientGone(Exception):
    """The client closed the connection before its request was read: there is no one to answer."""


def _raw_json_response(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response as bytes, for the protocol layer (before or outside an ASGI cycle)."""
    body = json.dumps({"error": message}).encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "Content-Type: application/json; charset=utf-8",
            f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{name}: {value}" for name, value in SECURITY_HEADERS.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus what it lacks: a deadline for a request's headers and one for its
    body, a hard cap on open connections, JSON answers to malformed requests, and a 400 (not a
    silent close) for a body cut short by the client. The SlideServer subclasses it per instance to
    set the class attributes below."""

    slide_server: SlideServer
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    max_connections: int = MAX_CONNECTIONS

    _deadline: asyncio.TimerHandle | None = None
    _deadline_phase: str | None = None
    _draining: bool = False  # refused: what the client still sends is read and dropped until it closes
    _served: bool = False  # a response below 400 went out on this connection (its client holds the token)
    LINGER_SECONDS = 1.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        opened = self.slide_server.open_connections
        opened[self] = None  # insertion order: the oldest first
        if len(self.connections) > self.max_connections and not self._evict_one():
            self._refuse_raw(503, f"the server already holds {self.max_connections} connections; try again shortly")
            return
        self._sync_deadline()

    def _evict_one(self) -> bool:
        """Make room at the cap by closing the oldest connection whose request head has not arrived
        (idle, or headers trickling in), those of clients never served first: a flood of idle or
        reconnecting connections, which never gets past the token, cannot keep out a client that has
        it, whose request head arrives at once. False when every other connection is busy."""
        candidates = [c for c in self.slide_server.open_connections
                      if c is not self and not c._draining and c.cycle is None and c.conn.their_state is h11.IDLE]
        if not candidates:
            return False
        victim = min(candidates, key=lambda c: c._served)  # the oldest never-served one, else the oldest
        self.slide_server.evictions += 1
        victim._cancel_deadline()
        victim._draining = True
        victim.transport.close()  # it asked nothing, so nothing is answered; the slot frees at once
        return True

    def connection_lost(self, exc) -> None:
        self._cancel_deadline()
        self.slide_server.open_connections.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._draining:
            return
        super().data_received(data)
        self._watch_status()
        self._sync_deadline()

    def _watch_status(self) -> None:
        """Mark this connection served when its request's answer starts below 400 (the client had the
        token). The cycle's task has not run yet when the request head is handled, so it sends through this."""
        cycle = self.cycle
        if cycle is None or getattr(cycle, "_status_watched", False):
            return
        send = cycle.send

        async def watched(message, _send=send, protocol=self):
            if message.get("type") == "http.response.start" and message.get("status", 500) < 400:
                protocol._served = True
            await _send(message)

        cycle.send = watched
        cycle._status_watched = True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._sync_deadline()

    def eof_received(self):
        """The client half-closed its side. A body still owed is answered 400; a complete request
        still gets its response (then the connection closes); otherwise the connection closes."""
        if self._draining:
            return None
        if self.conn.their_state is h11.SEND_BODY:
            self._refuse_raw(400, "the body is shorter than its Content-Length")
            return None
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False
            return True  # keep the write side open for the answer
        return None

    def shutdown(self) -> None:  # the server is stopping
        if self._draining:
            self.transport.close()
            return
        if self._phase() == "body":  # not waited for until the grace period ends (then cancelled mid-read)
            self._refuse_raw(503, "the server is stopping; send the request again once it is back")
            return
        super().shutdown()

    def send_400_response(self, msg: str) -> None:  # h11 refused the request head or framing
        self._refuse_raw(400, "malformed HTTP request (request line, a header, or the body framing)")

    # ------------------------------------------------------------------ deadlines
    def _phase(self) -> str | None:
        if self.transport is None or self.transport.is_closing() or self._draining:
            return None
        state = self.conn.their_state
        if state is h11.IDLE:
            return "headers"
        if state is h11.SEND_BODY:
            return "body"
        return None  # the request is in; the response may take as long as it needs

    def _sync_deadline(self) -> None:
        phase = self._phase()
        if phase == self._deadline_phase:
            return
        self._cancel_deadline()
        self._deadline_phase = phase
        if phase is not None:
            seconds = self.header_timeout if phase == "headers" else self.body_timeout
            self._deadline = self.loop.call_later(seconds, self._deadline_passed, phase, seconds)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._deadline_phase = None, None

    def _deadline_passed(self, phase: str, seconds: float) -> None:
        self._deadline = None
        what = "request headers" if phase == "headers" else "request body"
        self._refuse_raw(408, f"the {what} did not arrive within {seconds:g} s")

    def _refuse_raw(self, status: int, message: str) -> None:
        """Answer with a JSON error when no response has started on this connection, then close it.

        A lingering close: the answer goes out, then our side's FIN, and whatever the client still
        sends is dropped until it closes (at most LINGER_SECONDS). Closing at once with unread
        bytes would make the kernel send a reset, which can destroy the answer before it is read."""
        self._cancel_deadline()
        if self.transport is None or self.transport.is_closing() or self._draining:
            return
        answered = self.cycle is not None and self.cycle.response_started
        # A connection that never sent a byte (idle keep-alive, a browser's spare connection) is just closed.
        started = self.conn.their_state is not h11.IDLE or bool(self.conn.trailing_data[0])
        if not answered and (started or status == 503):
            self.transport.write(_raw_json_response(status, message))
            self.slide_server.refusals[status] += 1
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # for the application the client is gone: it answers nothing more
            self.cycle.message_event.set()
        self._draining = True
        self.transport.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(self.LINGER_SECONDS, self.transport.close)


def check_limits(max_connections: int = MAX_CONNECTIONS, header_timeout: float = HEADER_TIMEOUT,
                 body_timeout: float = BODY_TIMEOUT, keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT) -> None:
    """ValueError naming the flag when a limit is out of range."""
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
        raise ValueError(f"--max-connections must be an integer >= 1, got {max_connections!r}")
    for name, value in (("--header-timeout", header_timeout), ("--body-timeout", body_timeout),
                        ("keep_alive_timeout", keep_alive_timeout)):
        if not 0 < value <= 3600:  # also refuses nan
            raise ValueError(f"{name} must be in (0, 3600] seconds, got {value}")


class SlideServer:
    """The listening socket, the Starlette app, the uvicorn server, and what requests share: the
    pages, the token, the notes, the playground and the count of refused requests."""

    def __init__(self, host: str, port: int, *, deck_html: str, notes_dir: str | Path, playground: Playground,
                 allow_remote: bool = False, allowed_hosts: tuple[str, ...] = (),
                 max_connections: int = MAX_CONNECTIONS, header_timeout: float = HEADER_TIMEOUT,
                 body_timeout: float = BODY_TIMEOUT, keep_alive_timeout: int = KEEP_ALIVE_TIMEOUT,
                 graceful_shutdown: float = SHUTDOWN_GRACE) -> None:
        try:
            if not is_loopback(host) and not allow_remote:
                raise ValueError(f"--host {host} is not a loopback address; binding to it exposes the notes and "
                                 f"the playground to the network, so it needs --allow-remote")
            check_limits(max_connections, header_timeout, body_timeout, keep_alive_timeout)
        except ValueError:
            playground.close()
            raise
        self.playground = playground
        self.stopping = False  # set once a stop is asked for: a running generation ends at its next event
        self._closed = False
        self._serving = False
        self._finished = threading.Event()  # set when serve_forever returns
        try:
            self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(128)
            self.socket.setblocking(False)
        except OSError:
            self.socket.close()
            playground.close()
            raise
        self.server_address = self.socket.getsockname()[:2]
        self.token = secrets.token_urlsafe(24)
        self.cookie_name = f"{COOKIE_PREFIX}{self.server_address[1]}"
        self.notes = NotesStore(notes_dir)
        self.refusals: Counter[int] = Counter()  # refused requests by status, for the operator and tests
        self.open_connections: dict = {}  # the protocols of the open connections, the oldest first
        self.evictions = 0  # connections closed to make room at the cap
        bound_port = self.server_address[1]
        # a wildcard bind has no name of its own: the names clients may use come from --allowed-host
        names = {"127.0.0.1", "localhost", "[::1]", host if ":" not in host else f"[{host}]"}
        self.allowed_hosts = {f"{name}:{bound_port}" for name in names} | set(allowed_hosts)
        self.allowed_origins = {f"http://{h}" for h in self.allowed_hosts}
        playground_page = (ASSETS / "playground.html").read_text(encoding="utf-8")
        self.pages = {
            "/": deck_html.replace(TOKEN_PLACEHOLDER, self.token),
            "/playground": playground_page.replace(TOKEN_PLACEHOLDER, self.token),
        }
        # Computed from the package's own assets, never from the deck served (which holds receipt values).
        self.page_policies = {"/": deck_policy(), "/playground": playground_policy(playground_page)}
        protocol = type("SlideServerProtocol", (GuardedH11Protocol,),
                        {"slide_server": self, "header_timeout": header_timeout, "body_timeout": body_timeout,
                         "max_connections": max_connections})
        config = uvicorn.Config(
            build_app(self), http=protocol, ws="none", lifespan="off", loop="asyncio", interface="asgi3",
            log_config=None, log_level="error", access_log=False, server_header=False, proxy_headers=False,
            # uvicorn answers 503 once the open connections (the asking one included) or the requests in
            # flight reach limit_concurrency; one above the hard cap, every accepted connection is served
            limit_concurrency=max_connections + 1, timeout_keep_alive=keep_alive_timeout,
            h11_max_incomplete_event_size=H11_BUFFER_BYTES, timeout_graceful_shutdown=graceful_shutdown)
        self._uvicorn = uvicorn.Server(config)

    # ------------------------------------------------------------------ addresses
    @property
    def url(self) -> str:
        """The base URL (requests to it still need the token or the cookie)."""
        host, port = self.server_address
        shown = host if ":" not in host else f"[{host}]"
        return f"http://{shown}:{port}/"

    @property
    def launch_url(self) -> str:
        """The URL to open: it carries the token, and the first page loaded with it sets the cookie."""
        return f"{self.url}?{TOKEN_QUERY}={self.token}"

    # ------------------------------------------------------------------ running
    def serve_forever(self) -> None:
        self._serving = True
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self._finished.set()

    def wait(self, poll: float = 0.5) -> None:
        """Block until the server stops (an Event, not Thread.join: on Python < 3.13 a join that
        Ctrl-C interrupts marks the thread finished while it still runs).

        In the main thread, Ctrl-C (SIGINT) meanwhile asks the server to stop, and wait() returns once
        it has; a second Ctrl-C stops it without waiting for the requests in flight. A handler, never
        a KeyboardInterrupt: raised at whichever bytecode the main thread is on, that can land inside
        Event.wait's own lock handling (between a release and its re-acquire), which printed
        'RuntimeError: release unlocked lock' with a traceback, or left the lock held and the server
        never stopped."""
        handled = threading.current_thread() is threading.main_thread()
        if handled:
            previous = signal.signal(signal.SIGINT, self._interrupted)
        try:
            while not self._finished.wait(poll):
                pass
        finally:
            if handled:  # None: a handler not set from Python, which cannot be put back; the default then
                signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)

    def _interrupted(self, signum, frame) -> None:  # noqa: ARG002 - SIGINT while wait() runs
        if self.stopping:  # the second Ctrl-C: do not wait for the requests in flight
            self._uvicorn.force_exit = True
        self.request_stop()

    def request_stop(self) -> None:
        """Ask the server to stop, without waiting: it stops accepting, ends a running generation at its
        next event, gives the other requests in flight SHUTDOWN_GRACE seconds, then cancels them."""
        self.stopping = True
        self._uvicorn.should_exit = True

    def shutdown(self) -> None:
        """Stop serving and wait until it has stopped (see request_stop)."""
        self.request_stop()
        if self._serving:
            self._finished.wait()

    def server_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.socket.close()
        self.playground.close()

    # ------------------------------------------------------------------ request checks
    def token_matches(self, candidate: str | None) -> bool:
        if not candidate:
            return False
        return hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), self.token.encode())

    def authenticated_by(self, request: Request) -> str | None:
        """How the request proves it holds the launch token: 'header', 'cookie', 'query', or None."""
        if self.token_matches(request.headers.get(TOKEN_HEADER)):
            return "header"
        if self.token_matches(request.cookies.get(self.cookie_name)):
            return "cookie"
        if self.token_matches(request.query_params.get(TOKEN_QUERY)):
            return "query"
        return None

    def check_host(self, request: Request) -> None:
        hosts = request.headers.getlist("host")
        host = hosts[0] if len(hosts) == 1 else ""
        if host not in self.allowed_hosts:
            raise RequestRefused(403, f"Host {host!r} is not this server")

    def check_write(self, request: Request) -> None:
        """A write must come from a page this server served: same origin, JSON, the token in its header."""
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.allowed_origins:
            raise RequestRefused(403, f"cross-origin write refused (Origin {origin!r})")
        fetch_site = request.headers.get("sec-fetch-site")
        if fetch_site is not None and fetch_site not in ("same-origin", "none"):
            raise RequestRefused(403, f"cross-site write refused (Sec-Fetch-Site {fetch_site!r})")
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise RequestRefused(403, "writes must be sent as application/json")
        if not self.token_matches(request.headers.get(TOKEN_HEADER)):
            raise RequestRefused(403, f"missing or wrong {TOKEN_HEADER}; reload the page from this server")

    async def read_json(self, request: Request, stored: bool = True):
        if "transfer-encoding" in request.headers:
            raise RequestRefused(400, "Transfer-Encoding is not accepted; send a Content-Length")
        lengths = request.headers.getlist("content-length")
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
        try:
            data = await request.body()  # h11 delivers exactly Content-Length bytes or reports the disconnect
        except ClientDisconnect:
            raise _ClientGone() from None
        if len(data) != length:
            raise RequestRefused(400, "the body is shorter than its Content-Length")
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise RequestRefused(400, "the body is not valid UTF-8 JSON (or nests too deeply)") from None
        if stored and not _is_text(document):  # what is stored must be text; the playground names its own rule
            raise RequestRefused(400, "the body holds a lone surrogate escape (such as \\ud800), which is not text")
        return document

    def error(self, status: int, message: str, headers: dict | None = None) -> Response:
        self.refusals[status] += 1
        return JSONResponse({"error": message}, status_code=status, headers={"Connection": "close", **(headers or {})})


# --------------------------------------------------------------------------- the application


class Guard:
    """The outermost layer: Host, method and token checks before any route runs; every refusal and
    any unexpected failure answered as JSON (never a traceback); security headers on every answer."""

    def __init__(self, app, server: SlideServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        started = False

        async def send_with_headers(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                names = {name.lower() for name, _ in message.get("headers", [])}
                message = {**message, "headers": list(message.get("headers", []))
                           + [(n, v) for n, v in _SECURITY_HEADER_BYTES if n not in names]}
            await send(message)

        request = Request(scope)
        try:
            head = len(scope["raw_path"]) + len(scope["query_string"]) + sum(
                len(name) + len(value) + 4 for name, value in scope["headers"])
            if head > MAX_HEAD_BYTES:
                raise RequestRefused(431, f"the request head is over {MAX_HEAD_BYTES:,} bytes")
            self.server.check_host(request)
            if request.method not in ALLOWED_METHODS:
                raise RequestRefused(405, f"method {request.method} is not allowed")
            via = self.server.authenticated_by(request)
            if via is None:
                if request.url.path.startswith("/api/"):
                    raise RequestRefused(403, f"this server needs its launch token: send the {TOKEN_HEADER} header "
                                              f"or open the ?{TOKEN_QUERY}= URL that `glm53 serve` printed")
                self.server.refusals[403] += 1
                response = PlainTextResponse(
                    "403: this server needs its launch token. Open the URL that `glm53 serve` printed "
                    f"(it ends in ?{TOKEN_QUERY}=...); the page then keeps the token in a cookie.\n",
                    status_code=403, headers={"Connection": "close"})
                await response(scope, receive, send_with_headers)
                return
            scope.setdefault("state", {})["authenticated_by"] = via
            await self.app(scope, receive, send_with_headers)
        except RequestRefused as refused:
            if not started:
                await self.server.error(refused.status, str(refused))(scope, receive, send_with_headers)
        except _ClientGone:
            return
        except asyncio.CancelledError:  # the server is stopping and its grace period is over: no traceback
            return
        except Exception as error:  # noqa: BLE001 - an unexpected failure still gets an answer
            log.error("glm53 serve: %s %s failed: %s: %s", request.method, request.url.path, type(error).__name__,
                      error)
            if not started:
                await self.server.error(500, f"internal error: {type(error).__name__}")(scope, receive,
                                                                                          send_with_headers)


def build_app(server: SlideServer):
    async def page(request: Request) -> Response:
        response = Response(server.pages[request.url.path], media_type="text/html; charset=utf-8",
                            headers={"Content-Security-Policy": server.page_policies[request.url.path]})
        if request.scope["state"]["authenticated_by"] == "query":
            # Jupyter's convention: the token from the URL moves into a cookie the page's scripts cannot read
            response.set_cookie(server.cookie_name, server.token, httponly=True, samesite="strict", path="/")
        return response

    def notes_route(kind: str):
        async def endpoint(request: Request) -> Response:
            if request.method == "POST":
                server.check_write(request)
                body = await server.read_json(request)
                try:
                    return JSONResponse(await run_in_threadpool(server.notes.write, kind, body))
                except NoteError as error:
                    raise RequestRefused(400, str(error)) from None
            return JSONResponse(await run_in_threadpool(server.notes.read, kind))

        return endpoint

    async def describe(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(server.playground.describe))

    async def generate(request: Request):
        server.check_write(request)
        body = await server.read_json(request, stored=False)  # nothing is stored; prepare() checks each field
        playground = server.playground
        try:
            prepared = playground.prepare(body)
            playground.acquire()
        except PlaygroundError as error:
            raise RequestRefused(error.status, str(error)) from None
        except ValueError as error:  # e.g. an unknown task id
            raise RequestRefused(400, str(error)) from None
        return GenerationStream(playground, prepared, stopping=lambda: server.stopping)

    async def judge(request: Request) -> Response:
        server.check_write(request)
        body = await server.read_json(request, stored=False)
        playground = server.playground
        try:
            prepared = playground.prepare_judgement(body)
            playground.acquire()
        except PlaygroundError as error:
            raise RequestRefused(error.status, str(error)) from None
        try:
            return JSONResponse(await run_in_threadpool(playground.judge, prepared))
        finally:
            playground.release()

    async def not_found(request: Request, exc: HTTPException) -> Response:
        message = "not found" if exc.status_code == 404 else exc.detail
        return server.error(exc.status_code, message, headers=exc.headers)

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/playground", page, methods=["GET"]),
        Route("/api/feedback", notes_route("feedback"), methods=["GET", "POST"]),
        Route("/api/text-edits", notes_route("text-edits"), methods=["GET", "POST"]),
        Route("/api/playground", describe, methods=["GET"]),
        Route("/api/generate", generate, methods=["POST"]),
        Route("/api/judge", judge, methods=["POST"]),
    ]
    async def refused(request: Request, exc: RequestRefused) -> Response:
        return server.error(exc.status, str(exc))

    async def client_gone(request: Request, exc: _ClientGone):
        return _nothing

    async def internal(request: Request, exc: Exception) -> Response:  # Starlette re-raises it to the Guard
        return server.error(500, f"internal error: {type(exc).__name__}")

    app = Starlette(routes=routes, exception_handlers={HTTPException: not_found, RequestRefused: refused,
                                                       _ClientGone: client_gone, Exception: internal})
    app.router.redirect_slashes = False  # '/api/feedback/' is not found, not redirected
    return Guard(app, server)


async def _nothing(scope, receive, send) -> None:
    """The answer to a client that has gone: none."""


_END = object()  # the generator is exhausted (or was closed)
STOPPING_EVENT = {"type": "error", "error": "the server is stopping: the generation was cut short"}


class _Steps:
    """One generation's event generator, advanced one step at a time on worker threads. When the
    request is cancelled mid-step (the server stopping, its grace period over), closing the generator
    from the event loop would fail ('generator already executing') and free the slot while the model
    still runs: the thread running the step closes it once the step ends, and only then is the slot
    released. Exactly one of close() and that thread does it."""

    def __init__(self, events, release) -> None:
        self._events = events
        self._release = release
        self._lock = threading.Lock()
        self._running = False
        self._closed = False

    def next(self):
        """The next event, or _END (on a worker thread)."""
        with self._lock:
            if self._closed:
                return _END
            self._running = True
        try:
            return next(self._events, _END)
        finally:
            with self._lock:
                self._running = False
                finish = self._closed
            if finish:
                self._finish()

    def close(self) -> None:
        """Close the generator and free the slot now, or, when a step is running, as soon as it ends."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._running:
                return
        self._finish()

    def _finish(self) -> None:
        try:
            self._events.close()
        finally:
            self._release()


class GenerationStream:
    """Newline-delimited JSON, one event per line, sent as each token is decided. The model runs on
    a worker thread one event at a time; a client that goes away stops the generation quietly, and a
    server that stops ends it at its next event with an error event that says so."""

    def __init__(self, playground: Playground, prepared: dict, stopping=lambda: False) -> None:
        self.playground = playground
        self.prepared = prepared
        self.stopping = stopping

    async def __call__(self, scope, receive, send) -> None:
        gone = asyncio.Event()

        async def watch() -> None:  # the body is read; the next message is the disconnect (or the end)
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        def line(event: dict) -> dict:
            return {"type": "http.response.body", "body": json.dumps(event).encode() + b"\n", "more_body": True}

        end = {"type": "http.response.body", "body": b"", "more_body": False}
        watcher = asyncio.ensure_future(watch())
        steps = _Steps(self.playground.run(self.prepared), self.playground.release)
        started = False
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/x-ndjson; charset=utf-8"),
                                    (b"connection", b"close")]})
            started = True
            while not gone.is_set():
                if self.stopping():
                    await send(line(STOPPING_EVENT))
                    break
                try:
                    event = await run_in_threadpool(steps.next)
                except Exception as error:  # noqa: BLE001 (reported on the stream the page reads, then it ends)
                    await send(line({"type": "error", "error": f"{type(error).__name__}: {error}"}))
                    break
                if event is _END:
                    break
                await send(line(event))
            await send(end)
        except asyncio.CancelledError:  # stopping, the grace period over, mid-step: end the stream quietly
            if started:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await send(line(STOPPING_EVENT))
                    await send(end)
        finally:
            watcher.cancel()
            steps.close()


def start_server(host: str, port: int, *, deck_html: str, notes_dir: str | Path, playground: Playground,
                 allow_remote: bool = False, allowed_hosts: tuple[str, ...] = (),
                 **limits) -> tuple[SlideServer, threading.Thread]:
    """Bind, then serve on a background thread (tests and `glm53 serve` use this). `limits`:
    max_connections, header_timeout, body_timeout, keep_alive_timeout, graceful_shutdown."""
    server = SlideServer(host, port, deck_html=deck_html, notes_dir=notes_dir, playground=playground,
                         allow_remote=allow_remote, allowed_hosts=allowed_hosts, **limits)
    thread = threading.Thread(target=server.serve_forever, name="glm53-serve", daemon=True)
    server._serving = True  # from here shutdown() waits for serve_forever to return
    thread.start()
    return server, thread

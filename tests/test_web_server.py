"""`glm53 serve`: routes, notes with history, the playground's real model and verifier, and every
refused request (each answered with a 4xx and nothing written)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import threading
import struct
import subprocess
import sys
import time

import pytest
from process_helpers import wait_until
from web_helpers import RESULTS, parse_reply, post_json, raw, raw_reply, request, request_bytes, serve, stop

from glm53_flash.cli import main
from glm53_flash.evaluation.evaluate import generate_for_tasks
from glm53_flash.tasks import task_by_id
from glm53_flash.train.checkpoint import load_checkpoint
from glm53_flash.verifier import Verifier
from glm53_flash.web.notes import NotesStore
from glm53_flash.web.playground import (
    MAX_PROMPT_CHARS,
    NO_CHECKPOINT_HELP,
    Playground,
    PlaygroundError,
    RateLimiter,
    PromptError,
    check_prompt,
    default_checkpoint,
)
from glm53_flash.web.server import MAX_BODY_BYTES, TOKEN_HEADER, SlideServer

NOTE = {"feedback": {"result": "say the seed count out loud"},
        "catalog": {"result": {"title": "Result first", "lastKnownPosition": 1, "lastSeenAt": None}}}


def notes_files(server) -> dict:
    directory = server.notes.directory
    return {p.name: p.read_bytes() for p in directory.iterdir()} if directory.exists() else {}


# --------------------------------------------------------------------------- pages and notes


@pytest.mark.slow
def test_pages_embed_the_run_token_and_loopback_is_the_default(server):
    assert server.server_address[0] == "127.0.0.1"
    for path in ("/", "/playground"):
        status, body = request(server, "GET", path)
        assert status == 200 and server.token.encode() in body and b"__GLM53_TOKEN__" not in body
    status, body = request(server, "GET", "/api/feedback")
    assert status == 200 and json.loads(body) == {"version": 1, "updatedAt": None, "feedback": {}, "catalog": {}}
    status, body = request(server, "GET", "/api/text-edits")
    assert status == 200 and json.loads(body)["edits"] == {}


def test_pages_run_only_their_own_scripts_and_styles(server):
    """The second layer under escaping: each page's policy allows exactly the package's own script and
    stylesheet (by sha256), no 'unsafe-inline', no style attribute; every other answer allows none."""
    import re

    from glm53_flash.report.page_policy import source_hash

    for path in ("/", "/playground"):
        _, headers, body = parse_reply(raw_reply(server, request_bytes(server, "GET", path)))
        (policy,) = headers["content-security-policy"]
        assert "unsafe-inline" not in policy and "unsafe-hashes" not in policy and "frame-ancestors 'none'" in policy
        page = body.decode()
        scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
        styles = re.findall(r"<style>(.*?)</style>", page, flags=re.S)
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert scripts and directives["script-src"] == " ".join(source_hash(t) for t in scripts)
        assert styles and directives["style-src"] == " ".join(source_hash(t) for t in styles)
        assert not re.search(r"<[^>]+\sstyle=", page) and not re.search(r"<[^>]+\son[a-z]+=", page)
    _, headers, _ = parse_reply(raw_reply(server, request_bytes(server, "GET", "/api/feedback")))
    (policy,) = headers["content-security-policy"]
    assert "script-src" not in policy and "style-src" not in policy and policy.startswith("default-src 'none'")


def test_a_page_policy_comes_from_the_package_never_from_the_deck_served(deck_html, checkpoint, tmp_path):
    """A deck with a script that got past the escaping: the page's policy allows the package's deck.js
    and not that script."""
    from glm53_flash.report.page_policy import source_hash
    from glm53_flash.report.slides import deck_assets

    injected = "document.title = 'pwned'"
    tampered = deck_html.replace("</main>", f"<script>{injected}</script></main>", 1)
    srv = serve(tampered, tmp_path / "notes", checkpoint)
    try:
        _, headers, _ = parse_reply(raw_reply(srv, request_bytes(srv, "GET", "/")))
        (policy,) = headers["content-security-policy"]
        assert source_hash(deck_assets()[1]) in policy and source_hash(injected) not in policy
    finally:
        stop(srv)


def test_every_read_and_write_needs_the_launch_token(server):
    assert post_json(server, "/api/feedback", NOTE)[0] == 200
    secret = b"say the seed count out loud"
    port, token = server.server_address[1], server.token
    assert server.launch_url == f"http://127.0.0.1:{port}/?token={token}"
    # no token, a wrong one (in the header, the query or the cookie), or a non-ASCII one: 403, nothing read
    for headers in ({}, {TOKEN_HEADER: "x" * 32}, {"Cookie": f"glm53-token-{port}=" + "x" * 32},
                    {"Cookie": f"glm53-token-{port + 1}={token}"}, {TOKEN_HEADER: "\u00e9t\u00e9"}):
        for path in ("/", "/playground", "/api/feedback", "/api/text-edits", "/api/playground",
                     "/api/feedback?token=" + "y" * 32):
            status, body = request(server, "GET", path, token=False, headers=headers)
            assert status == 403, (path, headers, status)
            assert secret not in body and token.encode() not in body, path
            if path.startswith("/api/"):
                assert "launch token" in json.loads(body)["error"], path
            else:
                assert b"launch token" in body and b"?token=" in body
    # the printed URL: the page is served and the token moves into an HttpOnly, SameSite=Strict cookie
    status, headers, body = parse_reply(raw_reply(server, request_bytes(server, "GET", f"/?token={token}",
                                                                        token=False)))
    assert status == 200 and token.encode() in body
    (cookie,) = headers["set-cookie"]
    attributes = {part.strip().split("=")[0].lower(): part.strip() for part in cookie.split(";")}
    assert cookie.startswith(f"glm53-token-{port}={token};")
    assert "httponly" in attributes and attributes["samesite"].lower() == "samesite=strict"
    assert attributes["path"] == "Path=/" and "max-age" not in attributes and "expires" not in attributes
    jar = {"Cookie": f"glm53-token-{port}={token}"}
    for path in ("/", "/playground", "/api/feedback", "/api/playground"):
        status, headers, body = parse_reply(raw_reply(server, request_bytes(server, "GET", path, token=False,
                                                                            headers=jar)))
        assert status == 200 and "set-cookie" not in headers, path
    assert secret in request(server, "GET", "/api/feedback", token=False, headers=jar)[1]
    assert secret in request(server, "GET", f"/api/feedback?token={token}", token=False)[1]
    # a write needs the token in its header: the cookie alone (which a browser adds by itself) is not enough
    status, body = post_json(server, "/api/feedback", {"feedback": {}}, token=False, headers=jar)
    assert status == 403 and TOKEN_HEADER in json.loads(body)["error"]
    assert post_json(server, f"/api/feedback?token={token}", {"feedback": {}}, token=False)[0] == 403
    assert json.loads(request(server, "GET", "/api/feedback")[1])["feedback"] == NOTE["feedback"]


def test_notes_persist_across_a_restart_with_history(deck_html, checkpoint, tmp_path):
    first = serve(deck_html, tmp_path / "notes", None)
    try:
        status, body = post_json(first, "/api/feedback", NOTE)
        assert status == 200 and json.loads(body)["feedback"] == NOTE["feedback"]
        second_note = {"feedback": {"result": "changed my mind"}, "catalog": {}}
        assert post_json(first, "/api/feedback", second_note)[0] == 200
        assert post_json(first, "/api/text-edits", {"edits": {"result/title": "Result"}})[0] == 200
        old_token = first.token
    finally:
        stop(first)
    second = serve(deck_html, tmp_path / "notes", None)
    try:
        assert second.token != old_token  # a new run, a new token
        status, body = request(second, "GET", "/api/feedback")
        assert json.loads(body)["feedback"] == {"result": "changed my mind"}
        assert json.loads(request(second, "GET", "/api/text-edits")[1])["edits"] == {"result/title": "Result"}
        history = NotesStore(tmp_path / "notes").history("feedback")
        assert [h["feedback"]["result"] for h in history] == ["say the seed count out loud", "changed my mind"]
        assert post_json(second, "/api/feedback", NOTE, headers={"X-GLM53-Token": old_token})[0] == 403
    finally:
        stop(second)


# --------------------------------------------------------------------------- refused requests


def _refusals(server):
    port = server.server_address[1]
    body = json.dumps(NOTE).encode()
    head = f"POST /api/feedback HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n" \
           f"X-GLM53-Token: {server.token}\r\n"
    return {
        "no token": lambda: post_json(server, "/api/feedback", NOTE, token=False),
        "wrong token": lambda: post_json(server, "/api/feedback", NOTE, headers={"X-GLM53-Token": "x" * 32}),
        "other origin": lambda: post_json(server, "/api/feedback", NOTE, headers={"Origin": "http://evil.example"}),
        "other port origin": lambda: post_json(server, "/api/feedback", NOTE,
                                               headers={"Origin": f"http://127.0.0.1:{port + 1}"}),
        "cross-site fetch": lambda: post_json(server, "/api/feedback", NOTE, headers={"Sec-Fetch-Site": "cross-site"}),
        "text/plain body": lambda: post_json(server, "/api/feedback", NOTE, headers={"Content-Type": "text/plain"}),
        "form body": lambda: post_json(server, "/api/feedback", NOTE,
                                       headers={"Content-Type": "application/x-www-form-urlencoded"}),
        "rebound host": lambda: post_json(server, "/api/feedback", NOTE, host="attacker.example:80"),
        "missing length": lambda: raw(server, (head + "\r\n").encode() + body, half_close=True),
        "negative length": lambda: raw(server, (head + "Content-Length: -1\r\n\r\n").encode() + body),
        "huge length": lambda: raw(server, (head + f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n").encode() + body),
        "non-numeric length": lambda: raw(server, (head + "Content-Length: 12abc\r\n\r\n").encode() + body),
        "short body": lambda: raw(server, (head + f"Content-Length: {len(body) + 50}\r\n\r\n").encode() + body,
                                  half_close=True),
        "unicode digit length": lambda: raw(server, (head + "Content-Length: \u00b2\r\n\r\n").encode("latin-1") + body),
        "4,400-digit length": lambda: raw(server, (head + "Content-Length: " + "9" * 4400 + "\r\n\r\n").encode() + body),
        "two lengths": lambda: raw(server, (head + f"Content-Length: {len(body)}\r\nContent-Length: 5\r\n\r\n").encode()
                                   + body),
        "chunked": lambda: raw(server, (head + f"Transfer-Encoding: chunked\r\nContent-Length: {len(body)}\r\n\r\n")
                               .encode() + body),
        "17 KiB header": lambda: raw(server, (head + "X-Padding: " + "a" * 17_000 + "\r\n\r\n").encode()),
        "deeply nested json": lambda: request(server, "POST", "/api/feedback", b"[" * 100_000 + b"]" * 100_000),
        "not json": lambda: request(server, "POST", "/api/feedback", b"{not json"),
        "json array": lambda: post_json(server, "/api/feedback", [1, 2]),
        "non-string note": lambda: post_json(server, "/api/feedback", {"feedback": {"result": 5}}),
        "unknown field": lambda: post_json(server, "/api/feedback", {"feedback": {}, "script": "x"}),
        "bad catalog": lambda: post_json(server, "/api/feedback", {"catalog": {"a": {"lastKnownPosition": "1"}}}),
        "bad edits": lambda: post_json(server, "/api/text-edits", {"edits": ["a"]}),
        "unknown route": lambda: post_json(server, "/api/notes", NOTE),
        "PUT": lambda: request(server, "PUT", "/api/feedback", body),
        "DELETE": lambda: request(server, "DELETE", "/api/feedback"),
    }


def test_every_bad_write_is_refused_and_nothing_is_written(server):
    expected = {"no token": 403, "wrong token": 403, "other origin": 403, "other port origin": 403,
                "cross-site fetch": 403, "text/plain body": 403, "form body": 403, "rebound host": 403,
                "missing length": 411, "negative length": 400, "huge length": 413, "non-numeric length": 400,
                "short body": 400, "unicode digit length": 400, "4,400-digit length": 400, "two lengths": 400,
                "chunked": 400, "17 KiB header": 431, "deeply nested json": 400, "not json": 400, "json array": 400,
                "non-string note": 400,
                "unknown field": 400, "bad catalog": 400, "bad edits": 400, "unknown route": 404,
                "PUT": 405, "DELETE": 405}
    refusals = _refusals(server)
    assert set(refusals) == set(expected)
    for name, send in refusals.items():
        status, body = send()
        assert status == expected[name], (name, status, body)
        assert "error" in json.loads(body), name
        assert notes_files(server) == {}, f"{name} wrote a notes file"
    # the same server still accepts a proper write
    assert post_json(server, "/api/feedback", NOTE)[0] == 200


def test_an_unexpected_failure_answers_500_and_logs_one_line(server, monkeypatch, caplog):
    def broken(kind):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(server.notes, "read", broken)
    status, body = request(server, "GET", "/api/feedback")
    assert status == 500 and json.loads(body) == {"error": "internal error: RuntimeError"}
    records = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in records] == ["glm53 serve: GET /api/feedback failed: RuntimeError: disk on fire"]
    assert all(r.exc_info is None for r in records)  # one line, no traceback
    assert request(server, "GET", "/api/playground")[0] == 200  # the server carries on


def test_no_listing_no_traversal_and_notes_files_are_never_served(server):
    assert post_json(server, "/api/feedback", NOTE)[0] == 200
    secret = b"say the seed count out loud"
    for path in ("/assets/", "/api/", "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/feedback.json",
                 "/runs/slide-notes/feedback.json", "/notes/feedback.json", "/api/../feedback.json",
                 "/feedback.history.jsonl", "//etc/passwd", "/slides/", "/.git/config"):
        status, body = request(server, "GET", path)
        assert status == 404, path
        assert secret not in body and b"root:" not in body, path
    assert request(server, "GET", "/", host="evil.example")[0] == 403  # DNS rebinding: reads refused too


# --------------------------------------------------------------------------- slow and vanishing clients


def dribble(server, data: bytes, pause: float = 0.2, ceiling: float = 15.0) -> tuple[float, bytes]:
    """Connect, send `data` one byte every `pause` seconds (none if empty) and read until the server
    closes; return (seconds from connecting to the close, everything the server sent)."""
    started = time.monotonic()
    reply = b""
    with socket.create_connection(server.server_address, timeout=ceiling) as sock:
        sock.settimeout(pause)
        position = 0
        while time.monotonic() - started < ceiling:
            if position < len(data):
                try:
                    sock.sendall(data[position:position + 1])
                except OSError:  # the server closed first
                    break
                position += 1
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not chunk:
                break
            reply += chunk
    return time.monotonic() - started, reply


@pytest.mark.slow
def test_slow_clients_are_cut_off_at_the_deadlines(deck_html, tmp_path):
    limits = {"header_timeout": 1.0, "body_timeout": 1.5}
    slow = serve(deck_html, tmp_path / "notes", None, **limits)
    try:
        port = slow.server_address[1]
        head = f"POST /api/feedback HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n" \
               f"{TOKEN_HEADER}: {slow.token}\r\nContent-Length: 500\r\n\r\n".encode()
        cases = {
            "headers byte by byte": (head[:-4] + b"X-Padding: " + b"a" * 400, limits["header_timeout"]),
            "body byte by byte": (None, limits["body_timeout"]),
            "silent connection": (b"", limits["header_timeout"]),
        }
        for name, (data, deadline) in cases.items():
            if data is None:  # the whole head at once, then a slow body
                started = time.monotonic()
                with socket.create_connection(slow.server_address, timeout=15) as sock:
                    sock.sendall(head)
                    sock.settimeout(0.2)
                    reply = b""
                    for _ in range(75):
                        try:
                            sock.sendall(b" ")
                            chunk = sock.recv(65536)
                        except socket.timeout:
                            continue
                        except OSError:
                            break
                        if not chunk:
                            break
                        reply += chunk
                seconds = time.monotonic() - started
            else:
                seconds, reply = dribble(slow, data)
            assert deadline - 0.1 <= seconds <= deadline + 1.5, (name, seconds)
            if data == b"":
                assert reply == b"", name  # a connection that never sent a byte is closed without a word
            else:
                status, headers, body = parse_reply(reply)
                assert status == 408 and headers["connection"] == ["close"], (name, reply[:200])
                assert "did not arrive within" in json.loads(body)["error"], name
        assert slow.refusals[408] == 2 and notes_files(slow) == {}
        # a request that pauses but finishes within its deadlines is served
        with socket.create_connection(slow.server_address, timeout=10) as sock:
            whole = request_bytes(slow, "GET", "/api/feedback")
            sock.sendall(whole[:20])
            time.sleep(0.5)
            sock.sendall(whole[20:])
            assert parse_reply(b"".join(iter(lambda: sock.recv(65536), b"")))[0] == 200
    finally:
        stop(slow)


def test_at_the_cap_idle_connections_make_room_and_busy_ones_are_refused_at_once(deck_html, tmp_path):
    capped = serve(deck_html, tmp_path / "notes", None, max_connections=3, header_timeout=1.5)
    try:
        holders = [socket.create_connection(capped.server_address, timeout=10) for _ in range(3)]
        time.sleep(0.3)  # the server has accepted the three
        started = time.monotonic()
        assert request(capped, "GET", "/api/feedback")[0] == 200  # the oldest idle one made room
        assert time.monotonic() - started < 1.0
        assert holders[0].recv(100) == b"" and capped.evictions == 1
        for sock in holders:
            sock.close()
        # three connections each owing a body are busy: none is closed for a newcomer, which gets 503 at once
        busy = [socket.create_connection(capped.server_address, timeout=10) for _ in range(3)]
        for sock in busy:
            sock.sendall(request_bytes(capped, "POST", "/api/feedback", b"{}")[:-2])
        time.sleep(0.3)
        started = time.monotonic()
        status, body = raw(capped, request_bytes(capped, "GET", "/api/feedback"))
        assert status == 503 and "3 connections" in json.loads(body)["error"]
        assert time.monotonic() - started < 1.0
        for sock in busy:
            sock.close()
        assert wait_until(lambda: request(capped, "GET", "/api/feedback")[0] == 200, 5)
    finally:
        stop(capped)


def test_a_flood_of_reconnecting_idle_connections_does_not_keep_out_the_token(deck_html, tmp_path):
    """Without the token, a client reopens idle connections as fast as they close (the cap once held
    50 of 50 authenticated requests at 503 for 25 s); token holders keep being served throughout."""
    capped = serve(deck_html, tmp_path / "notes", None, max_connections=4, header_timeout=1.0)
    stop_flood = threading.Event()

    def flood():
        sockets = []
        while not stop_flood.is_set():
            try:
                sockets.append(socket.create_connection(capped.server_address, timeout=2))
            except OSError:
                pass
            sockets = sockets[-16:]
            time.sleep(0.01)
        for sock in sockets:
            sock.close()

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        time.sleep(0.5)
        statuses = [request(capped, "GET", "/api/feedback")[0] for _ in range(20)]
        assert statuses.count(200) >= 19, statuses
    finally:
        stop_flood.set()
        flooder.join(5)
        stop(capped)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (what a killed browser tab often sends)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.slow
def test_clients_that_vanish_leave_no_traceback_in_the_servers_log(checkpoint, tmp_path):
    """`glm53 serve` as a real process: clients go away mid-headers, mid-body, mid-stream and
    before reading; the server keeps serving, frees the generation slot, and writes nothing to stderr."""
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "glm53_flash.cli", "serve", "--port", "0", "--runs", str(RESULTS),
             "--checkpoint", str(checkpoint), "--notes", str(tmp_path / "notes")],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        lines = [process.stdout.readline() for _ in range(2)]
        assert lines[0].startswith("slides:") and lines[1].startswith("playground:"), (lines, stderr_path.read_text())
        url = lines[1].split()[1]
        assert "/playground?token=" in url
        base, token = url.split("/playground?token=")
        port = int(base.rsplit(":", 1)[1])

        class Remote:  # what web_helpers needs of a server
            server_address = ("127.0.0.1", port)

        remote = Remote()
        remote.token = token
        assert request(remote, "GET", "/api/playground")[0] == 200
        assert request(remote, "GET", "/api/playground", token=False)[0] == 403
        generate = request_bytes(remote, "POST", "/api/generate",
                                 json.dumps({"task_id": "dev-double-000", "max_new_tokens": 60}).encode())
        partial_note = request_bytes(remote, "POST", "/api/feedback", json.dumps(NOTE).encode())
        for data, how in ((generate[:25], "close"), (generate[:25], "reset"), (partial_note[:-10], "close"),
                          (partial_note[:-10], "reset"), (request_bytes(remote, "GET", "/"), "reset")):
            sock = socket.create_connection(remote.server_address, timeout=10)
            sock.sendall(data)
            time.sleep(0.1)
            _reset(sock) if how == "reset" else sock.close()
        def first_token() -> socket.socket | None:
            """A generation that has streamed its first token (None while the model is busy: 429)."""
            sock = socket.create_connection(remote.server_address, timeout=30)
            sock.sendall(generate)
            received = b""
            while b'"type": "token"' not in received:
                chunk = sock.recv(4096)
                if not chunk:
                    assert parse_reply(received)[0] == 429, received[:300]
                    sock.close()
                    return None
                received += chunk
            return sock

        for how in ("close", "reset"):  # leave in the middle of a streamed generation
            streams = []
            assert wait_until(lambda: streams.append(first_token()) or streams[-1] is not None, 60)
            _reset(streams[-1]) if how == "reset" else streams[-1].close()
        # the abandoned generation stops and frees the slot: a new one runs to its verdict
        def full_generation() -> bool:
            status, body = raw(remote, generate)
            return status == 200 and json.loads(body.decode().splitlines()[-1])["type"] == "verdict"

        assert wait_until(full_generation, 60)
        assert request(remote, "GET", "/api/feedback")[0] == 200
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # hung: its threads' stacks (faulthandler on SIGUSR1) say where
            process.send_signal(signal.SIGUSR1)
            time.sleep(2)
            raise AssertionError(f"glm53 serve did not stop within 30 s of SIGINT:\n{stderr_path.read_text()}") from None
        finally:
            process.kill()
            process.stdout.close()
    err = stderr_path.read_text()
    assert "Traceback" not in err and "Exception" not in err and "disconnect" not in err.lower(), err
    assert code == 0


def test_ctrl_c_stops_the_server_through_a_handler_never_a_keyboard_interrupt(deck_html, tmp_path):
    """`glm53 serve` waits in the main thread. A KeyboardInterrupt is raised at whichever bytecode that
    thread is on; inside threading's Event.wait it can land between a lock's release and its
    re-acquire: 'RuntimeError: release unlocked lock' with a traceback, or a lock left held and a
    server that never stops (rare with wait()'s 0.5 s polls; with a tight wait loop about one
    interrupt in five). So SIGINT, while wait() runs, asks the server to stop and wait() returns."""
    server = serve(deck_html, tmp_path / "notes", None)
    before = signal.getsignal(signal.SIGINT)
    installed = threading.Event()

    def interrupt() -> None:  # only once wait() has its handler: a KeyboardInterrupt would end the test session
        if wait_until(lambda: signal.getsignal(signal.SIGINT) is not before, 10):
            installed.set()
            os.kill(os.getpid(), signal.SIGINT)
        else:
            server.shutdown()

    interrupter = threading.Thread(target=interrupt, daemon=True)
    interrupter.start()
    try:
        server.wait()
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        interrupter.join(15)
        stop(server)
    assert installed.is_set() and not interrupted
    assert signal.getsignal(signal.SIGINT) is before  # the handler is wait()'s only
    with pytest.raises(OSError):
        socket.create_connection(server.server_address, timeout=2).close()


def _stream_until_first_token(server) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(server.server_address, timeout=20)
    sock.sendall(request_bytes(server, "POST", "/api/generate",
                               json.dumps({"prompt": "def f(x):", "max_new_tokens": 8}).encode()))
    received = b""
    while b'"type": "token"' not in received:
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    return sock, received


def _rest(sock: socket.socket, received: bytes) -> list[dict]:
    with sock:
        while chunk := sock.recv(65536):
            received += chunk
    status, _, body = parse_reply(received)
    assert status == 200
    return _events(body)


def _loud_records(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" + (" (with a traceback)" if r.exc_info else "")
            for r in caplog.records if r.levelno >= logging.WARNING]


def test_stopping_the_server_ends_a_running_generation_at_its_next_token(deck_html, checkpoint, tmp_path, caplog):
    """Ctrl-C while a long generation streams: the stream ends at the next token with an event that
    says why, and the server stops at once instead of waiting out the grace period and then cancelling
    the request mid-step (which logged 'generator already executing' and left the slot taken)."""
    server = serve(deck_html, tmp_path / "notes", checkpoint)  # the default grace period: 5 s
    closed = []

    def slow_run(request):
        try:
            yield {"type": "start"}
            for _ in range(400):  # 20 s of tokens
                yield {"type": "token", "id": 0, "text": "x"}
                time.sleep(0.05)
        finally:
            closed.append(threading.current_thread())

    server.playground.run = slow_run
    try:
        sock, received = _stream_until_first_token(server)
        started = time.monotonic()
        server.shutdown()
        elapsed = time.monotonic() - started
    finally:
        stop(server)
    events = _rest(sock, received)
    assert elapsed < 2.5, elapsed
    assert events[-1]["type"] == "error" and "stopping" in events[-1]["error"], events[-3:]
    assert len(closed) == 1 and _loud_records(caplog) == []
    server.playground.acquire()  # the slot is free again
    server.playground.release()


def test_a_generation_step_that_outlasts_the_grace_period_ends_quietly(deck_html, checkpoint, tmp_path, caplog):
    """A step can take longer than the grace period (the C kernels' first build, a verdict's sandbox
    runs): the request is cancelled mid-step. The generator is closed by the thread that runs it once
    the step ends, and only then is the slot freed; the answer still ends as a well-formed stream."""
    server = serve(deck_html, tmp_path / "notes", checkpoint, graceful_shutdown=0.5)
    gate = threading.Event()
    closed = []

    def stuck_run(request):
        try:
            yield {"type": "start"}
            yield {"type": "token", "id": 0, "text": "x"}
            gate.wait(30)
            yield {"type": "token", "id": 0, "text": "y"}
        finally:
            closed.append(threading.current_thread())

    server.playground.run = stuck_run
    try:
        sock, received = _stream_until_first_token(server)
        time.sleep(0.2)  # the next step has started
    finally:
        stop(server)
    try:
        events = _rest(sock, received)
        assert events[-1]["type"] == "error" and "stopping" in events[-1]["error"], events[-3:]
        assert closed == []
        with pytest.raises(PlaygroundError):  # the model is still busy with that step
            server.playground.acquire()
    finally:
        gate.set()
    assert wait_until(lambda: closed, 10)
    assert closed[0] is not threading.main_thread()
    assert wait_until(lambda: not server.playground._busy.locked(), 10)
    loud = [line for line in _loud_records(caplog) if "timeout graceful shutdown exceeded" not in line]
    assert loud == [], loud


def test_a_request_body_still_arriving_at_shutdown_is_answered_503_at_once(deck_html, tmp_path, caplog):
    """A client trickling a body when the server stops gets a 503 and the server stops at once (it
    waited out the grace period, then cancelled the request and logged its traceback)."""
    server = serve(deck_html, tmp_path / "notes", None)  # the default grace period: 5 s
    data = request_bytes(server, "POST", "/api/feedback", json.dumps(NOTE).encode())
    sock = socket.create_connection(server.server_address, timeout=20)
    replies = []

    def read() -> None:  # what a client gets; it closes at the end, as a browser does
        with sock:
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
            replies.append(reply)

    reader = threading.Thread(target=read, daemon=True)
    try:
        sock.sendall(data[:-10])
        assert wait_until(lambda: any(c.cycle is not None for c in list(server.open_connections)), 10)
        reader.start()
        started = time.monotonic()
        server.shutdown()
        elapsed = time.monotonic() - started
    finally:
        stop(server)
        reader.join(20)
    status, _, body = parse_reply(replies[0])
    assert status == 503 and "stopping" in json.loads(body)["error"]
    assert elapsed < 2.5, elapsed
    assert _loud_records(caplog) == [] and notes_files(server) == {}


# --------------------------------------------------------------------------- binding


def test_non_loopback_bind_needs_the_explicit_flag(deck_html, tmp_path, capsys):
    from glm53_flash.web.playground import Playground

    with pytest.raises(ValueError, match="--allow-remote"):
        SlideServer("0.0.0.0", 0, deck_html=deck_html, notes_dir=tmp_path, playground=Playground(None))
    assert main(["serve", "--host", "0.0.0.0", "--port", "0", "--notes", str(tmp_path / "n")]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    remote = SlideServer("0.0.0.0", 0, deck_html=deck_html, notes_dir=tmp_path, playground=Playground(None),
                         allow_remote=True, allowed_hosts=("lecture-room.lan:8765",))
    assert "lecture-room.lan:8765" in remote.allowed_hosts and "http://lecture-room.lan:8765" in remote.allowed_origins
    remote.server_close()


def test_limits_out_of_range_are_one_line_errors(tmp_path, capsys):
    for flags, words in ((["--max-connections", "0"], "--max-connections must be an integer >= 1"),
                         (["--header-timeout", "0"], "--header-timeout must be in (0, 3600]"),
                         (["--body-timeout", "nan"], "--body-timeout must be in (0, 3600]")):
        assert main(["serve", "--port", "0", "--notes", str(tmp_path / "n"), *flags]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err


@pytest.mark.slow
def test_a_busy_port_is_a_one_line_error(tmp_path, capsys, checkpoint):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port), "--notes", str(tmp_path / "n"), "--checkpoint",
                     str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err


# --------------------------------------------------------------------------- the playground


def _events(body: bytes) -> list[dict]:
    return [json.loads(line) for line in body.decode().splitlines() if line]


def test_playground_streams_the_real_model_and_the_verifiers_verdict(server, checkpoint):
    task = task_by_id("dev-double-000")
    status, body = post_json(server, "/api/generate", {"task_id": task.task_id, "max_new_tokens": 40})
    assert status == 200
    events = _events(body)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "start" and kinds[-2:] == ["done", "verdict"] and set(kinds[1:-2]) == {"token"}
    done, verdict = events[-2], events[-1]
    tokens = [e["id"] for e in events if e["type"] == "token"]
    assert "".join(e["text"] for e in events if e["type"] == "token") == done["completion"]
    model, _ = load_checkpoint(checkpoint)
    (expected,), = generate_for_tasks(model, [task], max_new_tokens=40)
    assert tokens == list(expected.token_ids) and done["finish_reason"] == expected.finish_reason
    with Verifier(workers=1) as verifier:
        overall = verifier.evaluate(task, task.prompt + expected.text)
    assert verdict["evaluation"] == overall.to_dict()
    assert [c["number"] for c in verdict["cases"]] == [1, 2, 3]
    assert sum(c["passed"] for c in verdict["cases"]) == overall.tests_passed
    assert verdict["prompt_edited"] is False
    assert all(notes_files(server) == {} for _ in [0])  # generation writes no notes


def test_playground_refuses_bad_requests(server):
    for payload, status in [({"task_id": "dev-nosuch-000"}, 400), ({"task_id": "confirm-double-000"}, 400), ({"prompt": ""}, 400), ({"prompt": "x" * 5000}, 400),
                            ({"prompt": "def f(x):", "temperature": -1}, 400),
                            ({"prompt": "def f(x):", "max_new_tokens": 10_000}, 400),
                            ({"prompt": "def f(x):", "extra": 1}, 400), ({"prompt": "x" * 180}, 400)]:
        assert post_json(server, "/api/generate", payload)[0] == status, payload
    assert post_json(server, "/api/generate", {"prompt": "def f(x):"}, token=False)[0] == 403


def test_the_cli_and_the_server_refuse_the_same_prompts_with_the_same_words(server, checkpoint, capsys):
    too_long = "x" * (MAX_PROMPT_CHARS + 1)
    for prompt, words in (("", "prompt is empty"), (too_long, "at most"), ("def f(x):\udcff", "not valid UTF-8")):
        with pytest.raises(PromptError, match=words) as refused:
            check_prompt(prompt)
        message = str(refused.value)
        status, body = post_json(server, "/api/generate", {"prompt": prompt, "max_new_tokens": 4})
        assert status == 400 and json.loads(body)["error"] == message, (prompt[:20], body)
        assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", prompt, "--max-new-tokens", "4"]) == 2
        assert capsys.readouterr().err == f"glm53 generate: error: {message}\n"
    # and a prompt both accept
    assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", "def f(x):", "--max-new-tokens", "2"]) == 0
    assert post_json(server, "/api/generate", {"prompt": "def f(x):", "max_new_tokens": 2})[0] == 200


def test_playground_generates_in_the_precision_asked_for(checkpoint, monkeypatch):
    """`glm53 serve --precision`: the playground resolves it once, shows it, and every generation runs
    in it (the real generator is called through; the spy only records what it was given)."""
    from glm53_flash.evaluation import sampling

    seen = []
    real = sampling.stream_generate

    def recording(model, prompt, settings):
        seen.append(settings.precision)
        return real(model, prompt, settings)

    monkeypatch.setattr(sampling, "stream_generate", recording)
    playground = Playground(checkpoint, precision="bf16")
    try:
        info = playground.describe()
        assert info["precision"] == "bf16" and info["precision_reason"]
        request = playground.prepare({"prompt": "def f(x):", "max_new_tokens": 3})
        events = list(playground.run(request))
        assert events[-1]["type"] == "done" and [p.name for p in seen] == ["bf16"]
    finally:
        playground.close()
    default = Playground(checkpoint)
    try:
        assert default.describe()["precision"] == "fp32"  # the CPU's default
    finally:
        default.close()
    with pytest.raises(ValueError, match="precision"):
        Playground(checkpoint, precision="fp16")


def test_playground_rate_limit(deck_html, checkpoint, tmp_path):
    limited = serve(deck_html, tmp_path / "notes", checkpoint, per_minute=1)
    try:
        assert post_json(limited, "/api/generate", {"prompt": "def f(x):", "max_new_tokens": 2})[0] == 200
        status, body = post_json(limited, "/api/generate", {"prompt": "def f(x):", "max_new_tokens": 2})
        assert status == 429 and "rate limit" in json.loads(body)["error"]
    finally:
        stop(limited)
    now = [0.0]
    limiter = RateLimiter(2, clock=lambda: now[0])
    assert limiter.allow() and limiter.allow() and not limiter.allow()
    now[0] = 60.0
    assert limiter.allow()


def test_without_a_checkpoint_the_page_says_which_command_makes_one(deck_html, tmp_path):
    bare = serve(deck_html, tmp_path / "notes", None)
    try:
        info = json.loads(request(bare, "GET", "/api/playground")[1])
        assert info["ready"] is False and "make demo" in info["message"] and info["message"] == NO_CHECKPOINT_HELP
        assert post_json(bare, "/api/generate", {"task_id": "dev-double-000"})[0] == 503
    finally:
        stop(bare)


def test_default_checkpoint_is_the_best_dev_selection_of_the_demo(tmp_path, checkpoint):
    demo = tmp_path / "demo"
    assert default_checkpoint(demo) is None
    (demo / "pretrain").mkdir(parents=True)
    (demo / "plan.json").write_text(json.dumps({"plan": {"rl_seeds": [5, 6]}}))
    (demo / "pretrain" / "selection-dev.json").write_text(json.dumps({"selected": {"checkpoint": str(checkpoint),
                                                                                    "score": [3]}}))
    assert default_checkpoint(demo) == checkpoint
    for seed, score in ((5, 10), (6, 12)):
        ckpt = demo / f"rl-{seed}" / "checkpoint-0001"
        ckpt.mkdir(parents=True)
        (demo / f"rl-{seed}" / "selection-dev.json").write_text(
            json.dumps({"selected": {"checkpoint": str(ckpt), "score": [score]}}))
    assert default_checkpoint(demo) == demo / "rl-6" / "checkpoint-0001"
    # a two-arm directory: the playground serves its `ours` arm
    two_arms = tmp_path / "two-arms"
    (two_arms / "faithful").mkdir(parents=True)
    shutil.copytree(demo, two_arms / "ours")
    (two_arms / "ours" / "rl-6" / "selection-dev.json").write_text(json.dumps(
        {"selected": {"checkpoint": str(two_arms / "ours" / "rl-6" / "checkpoint-0001"), "score": [12]}}))
    assert default_checkpoint(two_arms) == two_arms / "ours" / "rl-6" / "checkpoint-0001"


def test_notes_history_skips_unchanged_saves_and_rolls_over(tmp_path, monkeypatch):
    from glm53_flash.web import notes as notes_module

    store = NotesStore(tmp_path)
    first = store.write("text-edits", {"edits": {"result/title": "Result first"}})
    again = store.write("text-edits", {"edits": {"result/title": "Result first"}})  # an autosave, nothing new
    assert again == first and len(store.history("text-edits")) == 1
    monkeypatch.setattr(notes_module, "HISTORY_MAX_BYTES", 200)
    for i in range(6):
        store.write("text-edits", {"edits": {"result/title": f"version {i} " + "x" * 40}})
    assert (tmp_path / "text-edits.history.1.jsonl").exists()
    assert (tmp_path / "text-edits.history.jsonl").stat().st_size <= 200
    assert store.read("text-edits")["edits"]["result/title"].startswith("version 5")
    assert store.history("text-edits")[-1]["edits"]["result/title"].startswith("version 5")


@pytest.mark.parametrize("path", ["/api/feedback", "/api/text-edits", "/api/generate"])
def test_a_lone_surrogate_in_a_body_is_a_400_with_nothing_written(server, path):
    """JSON's \\ud800 escape spells a lone surrogate: valid JSON, not text. Every route refuses it as a
    400 (it once gave 500 and left an empty history file) and no note file changes; the playground
    names the prompt rule it breaks, as `glm53 generate` does."""
    before = notes_files(server)
    for body in (b'{"feedback": {"k": "\\ud800"}}', b'{"edits": {"\\udfff": "x"}}', b'{"prompt": "def f(x):\\ud800"}'):
        status, reply = request(server, "POST", path, body)
        assert status == 400, (path, body, reply)
        if path != "/api/generate":
            assert b"lone surrogate" in reply, (path, body, reply)
    status, reply = request(server, "POST", path, b'{"feedback": "\xff"}')  # raw bytes that are not UTF-8
    assert status == 400
    assert notes_files(server) == before


def test_a_learners_own_tests_are_judged_by_the_verifier_with_the_rewards_policy(server):
    """POST /api/judge: a learner's function and rows; each row judged alone; bad input is one line, 400."""
    status, body = post_json(server, "/api/judge", {"source": "def double(x):\n    return x + x\n",
                                                     "tests": "3 -> 6\n'ab' -> 'abba'\n# a comment\n[1] -> [1, 1]"})
    verdict = json.loads(body)
    assert status == 200 and verdict["own_tests"] is True and verdict["entry_point"] == "double"
    assert [c["passed"] for c in verdict["cases"]] == [True, False, True]
    assert verdict["evaluation"]["tests_passed"] == 2 and verdict["evaluation"]["status"] == "failed"
    # the reward's static policy applies: an import is refused before anything runs
    status, body = post_json(server, "/api/judge", {"source": "import os\ndef f(x):\n    return os.sep\n",
                                                     "tests": "1 -> 1"})
    assert status == 200 and json.loads(body)["evaluation"]["status"] == "invalid"
    for payload, words in [({"source": "def f(x):\n    return x\n", "tests": "1 => 1"}, "tests row 1"),
                           ({"source": "def f(x):\n    return x\n", "tests": "open('x') -> 1"}, "Python literals"),
                           ({"source": "x = 1", "tests": "1 -> 1"}, "must define one"),
                           ({"source": "def f(x):\n    return x\n", "tests": "\n".join(["1 -> 1"] * 21)}, "at most 20"),
                           ({"source": "def f(x):\n    return x\n"}, "tests must be a string"),
                           ({"source": "def f(x):\n    return x\n", "tests": "1 -> 1", "extra": 1}, "unknown fields")]:
        status, body = post_json(server, "/api/judge", payload)
        assert status == 400 and words in json.loads(body)["error"] and "\n" not in json.loads(body)["error"], payload
    assert post_json(server, "/api/judge", {"source": "def f(x):\n    return x\n", "tests": "1 -> 1"}, token=False)[0] == 403
    # with the model: the completion is judged on the learner's rows
    status, body = post_json(server, "/api/generate", {"prompt": "def f(x):\n    return x\n", "tests": "1 -> 1",
                                                        "max_new_tokens": 4})
    events = _events(body)
    assert status == 200 and events[-1]["type"] == "verdict" and events[-1]["own_tests"] is True

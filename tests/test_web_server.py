"""`glm53 serve`: routes, notes with history, the playground's real model and verifier, and every
refused request (each answered with a 4xx and nothing written)."""

from __future__ import annotations

import json

import pytest
from web_helpers import post_json, raw, request, serve, stop

from glm53_flash.cli import main
from glm53_flash.evaluate import generate_for_tasks
from glm53_flash.tasks import task_by_id
from glm53_flash.train.checkpoint import load_checkpoint
from glm53_flash.verifier import Verifier
from glm53_flash.web.notes import NotesStore
from glm53_flash.web.playground import (
    NO_CHECKPOINT_HELP,
    RateLimiter,
    default_checkpoint,
)
from glm53_flash.web.server import MAX_BODY_BYTES, SlideServer

NOTE = {"feedback": {"result": "say the seed count out loud"},
        "catalog": {"result": {"title": "Result first", "lastKnownPosition": 1, "lastSeenAt": None}}}


def notes_files(server) -> dict:
    directory = server.notes.directory
    return {p.name: p.read_bytes() for p in directory.iterdir()} if directory.exists() else {}


# --------------------------------------------------------------------------- pages and notes


def test_pages_embed_the_run_token_and_loopback_is_the_default(server):
    assert server.server_address[0] == "127.0.0.1"
    for path in ("/", "/playground"):
        status, body = request(server, "GET", path)
        assert status == 200 and server.token.encode() in body and b"__GLM53_TOKEN__" not in body
    status, body = request(server, "GET", "/api/feedback")
    assert status == 200 and json.loads(body) == {"version": 1, "updatedAt": None, "feedback": {}, "catalog": {}}
    status, body = request(server, "GET", "/api/text-edits")
    assert status == 200 and json.loads(body)["edits"] == {}


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
                "chunked": 400, "deeply nested json": 400, "not json": 400, "json array": 400, "non-string note": 400,
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

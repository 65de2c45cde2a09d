"""Slide notes: the deck's feedback notes and text edits, validated and stored with history.

The original's `/api/feedback` document shape is kept ({version, updatedAt, feedback, catalog});
`/api/text-edits` (a route the original deck called but its server lacked) stores
{version, updatedAt, edits: {key: text}}. Every write replaces the current file atomically
(temporary file, then rename) and appends the stored document to an append-only history file, so
no note is ever lost to a later write. Notes live in their own directory, outside anything served.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from glm53_flash.core.receipts import append_text, read_json, read_jsonl, utc_now, write_json

MAX_KEY_CHARS = 200
MAX_TEXT_CHARS = 20_000
MAX_ENTRIES = 2_000

KINDS = ("feedback", "text-edits")


class NoteError(ValueError):
    """A request body that does not have the document's shape; answered with 400."""


def empty_document(kind: str) -> dict:
    if kind == "feedback":
        return {"version": 1, "updatedAt": None, "feedback": {}, "catalog": {}}
    if kind == "text-edits":
        return {"version": 1, "updatedAt": None, "edits": {}}
    raise ValueError(f"unknown notes kind {kind!r}; allowed: {', '.join(KINDS)}")


def _check_key(key, where: str) -> None:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        raise NoteError(f"{where}: keys must be non-empty strings of at most {MAX_KEY_CHARS} characters")


def _text_map(value, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise NoteError(f"{where} must be an object")
    if len(value) > MAX_ENTRIES:
        raise NoteError(f"{where} has {len(value)} entries; at most {MAX_ENTRIES} are allowed")
    for key, text in value.items():
        _check_key(key, where)
        if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
            raise NoteError(f"{where}[{key!r}] must be a string of at most {MAX_TEXT_CHARS} characters")
    return dict(value)


def _catalog(value) -> dict:
    if not isinstance(value, dict):
        raise NoteError("catalog must be an object")
    if len(value) > MAX_ENTRIES:
        raise NoteError(f"catalog has {len(value)} entries; at most {MAX_ENTRIES} are allowed")
    clean = {}
    for key, entry in value.items():
        _check_key(key, "catalog")
        if not isinstance(entry, dict):
            raise NoteError(f"catalog[{key!r}] must be an object")
        title = entry.get("title", "")
        position = entry.get("lastKnownPosition")
        seen = entry.get("lastSeenAt")
        if not isinstance(title, str) or len(title) > MAX_TEXT_CHARS:
            raise NoteError(f"catalog[{key!r}].title must be a string")
        if position is not None and (isinstance(position, bool) or not isinstance(position, int)):
            raise NoteError(f"catalog[{key!r}].lastKnownPosition must be an integer or null")
        if seen is not None and (not isinstance(seen, str) or len(seen) > 64):
            raise NoteError(f"catalog[{key!r}].lastSeenAt must be a short string or null")
        clean[key] = {"title": title, "lastKnownPosition": position, "lastSeenAt": seen}
    return clean


def validate(kind: str, body) -> dict:
    """The document to store for a POSTed body, or NoteError naming what is wrong."""
    if not isinstance(body, dict):
        raise NoteError("the body must be a JSON object")
    if kind == "feedback":
        unknown = set(body) - {"version", "updatedAt", "feedback", "catalog"}
        if unknown:
            raise NoteError(f"unknown fields: {', '.join(sorted(unknown))}")
        return {"version": 1, "updatedAt": utc_now(), "feedback": _text_map(body.get("feedback", {}), "feedback"),
                "catalog": _catalog(body.get("catalog", {}))}
    if kind == "text-edits":
        unknown = set(body) - {"version", "updatedAt", "edits"}
        if unknown:
            raise NoteError(f"unknown fields: {', '.join(sorted(unknown))}")
        return {"version": 1, "updatedAt": utc_now(), "edits": _text_map(body.get("edits", {}), "edits")}
    raise ValueError(f"unknown notes kind {kind!r}")


HISTORY_MAX_BYTES = 8_000_000  # per file; one older file is kept


def _content(document: dict) -> dict:
    return {key: value for key, value in document.items() if key != "updatedAt"}


class NotesStore:
    """`<dir>/<kind>.json` (the current document) and `<dir>/<kind>.history.jsonl` (every write)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()

    def path(self, kind: str) -> Path:
        empty_document(kind)  # validates the kind
        return self.directory / f"{kind}.json"

    def history_path(self, kind: str) -> Path:
        return self.directory / f"{kind}.history.jsonl"

    def read(self, kind: str) -> dict:
        """The stored document; the empty skeleton when the file is missing or unreadable."""
        document = empty_document(kind)
        try:
            stored = read_json(self.path(kind))
        except (OSError, ValueError):
            return document
        if isinstance(stored, dict):
            for key in document:
                if key in stored and isinstance(stored[key], type(document[key]) if document[key] is not None
                                                else (str, type(None))):
                    document[key] = stored[key]
        return document

    def write(self, kind: str, body) -> dict:
        """Validate, append to the history, then atomically replace the current document.

        A document equal to the stored one (apart from its timestamp) is not written again, and the
        history rolls over to `<kind>.history.1.jsonl` past HISTORY_MAX_BYTES, so autosaves cannot
        fill the disk."""
        document = validate(kind, body)
        with self._lock:
            current = self.read(kind)
            if current["updatedAt"] is not None and _content(current) == _content(document):
                return current
            self.directory.mkdir(parents=True, exist_ok=True)
            line = json.dumps(document, sort_keys=True, ensure_ascii=False) + "\n"
            history = self.history_path(kind)
            if history.exists() and history.stat().st_size + len(line.encode()) > HISTORY_MAX_BYTES:
                history.replace(self.directory / f"{kind}.history.1.jsonl")
            append_text(history, line, within=self.directory, sync=True)
            write_json(self.path(kind), document, within=self.directory)
        return document

    def history(self, kind: str) -> list[dict]:
        """Every stored version, oldest first (the rolled-over file, then the current one)."""
        rows = []
        for path in (self.directory / f"{kind}.history.1.jsonl", self.history_path(kind)):
            if path.exists():
                rows += read_jsonl(path)
        return rows

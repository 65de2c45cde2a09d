import functools

import pytest
import torch

from glm53_flash.evaluation.ledger import code_state as REAL_CODE_STATE  # before private_ledger replaces it


@pytest.fixture(autouse=True)
def private_ledger(tmp_path_factory, monkeypatch):
    """Every test that opens a sealed split records it in a ledger of its own, never in the checkout's
    results/ledger.jsonl (the ledger module's default, pointed here at a temporary file), and opens it
    as from committed code (a test that checks the refusal of uncommitted code says so itself)."""
    from glm53_flash.evaluation import ledger

    path = tmp_path_factory.mktemp("ledger") / "ledger.jsonl"
    monkeypatch.setattr(ledger, "_DEFAULT_OVERRIDE", path)
    state = {"commit": _head_commit(), "clean": True, "changes": []}
    monkeypatch.setattr(ledger, "code_state", lambda root=None: dict(state))
    return path


@functools.lru_cache(maxsize=1)
def _head_commit():
    from glm53_flash.evaluation import ledger

    return REAL_CODE_STATE()["commit"]


@pytest.fixture(scope="session", autouse=True)
def committed_ledger_untouched():
    """No test changes the checkout's results/ledger.jsonl (checked after the whole session): what was
    there stays, and no line it gained came from this process (another process, a study running beside
    the tests, may append its own)."""
    import json
    import sys

    from glm53_flash.evaluation.ledger import committed_ledger

    path = committed_ledger()
    before = path.read_bytes() if path is not None and path.is_file() else b""
    yield
    after = path.read_bytes() if path is not None and path.is_file() else b""
    assert after.startswith(before), f"the test session rewrote {path}"
    mine = [line for line in after[len(before):].decode().splitlines()
            if line.strip() and json.loads(line).get("command") == sys.argv]
    assert mine == [], f"the test session appended {len(mine)} line(s) to {path}"


@pytest.fixture
def one_thread():
    """Tiny models' ops are too small to gain from threads; on a shared 2-core machine extra threads
    only add contention. Restored afterwards so other tests are unaffected."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------- the web server tests' fixtures
# (module-scoped where building is slow: the deck and a tiny real checkpoint)


@pytest.fixture(scope="module")
def deck_html():
    from glm53_flash.experiments.registry import deck_entries, study_of
    from glm53_flash.report.slides import build_deck
    from web_helpers import RESULTS

    return build_deck(RESULTS, deck_entries(), study_of)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from web_helpers import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "checkpoint-0000")


@pytest.fixture
def server(deck_html, checkpoint, tmp_path):
    from web_helpers import serve, stop

    srv = serve(deck_html, tmp_path / "notes", checkpoint)
    yield srv
    stop(srv)

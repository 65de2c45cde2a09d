import pytest
import torch


@pytest.fixture(autouse=True)
def private_ledger(tmp_path_factory, monkeypatch):
    """Every test that opens a sealed split records it in a ledger of its own, never in the checkout's
    results/ledger.jsonl (GLM53_LEDGER overrides the default location)."""
    path = tmp_path_factory.mktemp("ledger") / "ledger.jsonl"
    monkeypatch.setenv("GLM53_LEDGER", str(path))
    return path


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
    from glm53_flash.report.slides import build_deck
    from web_helpers import RESULTS

    return build_deck(RESULTS)


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

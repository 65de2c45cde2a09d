import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models' ops are too small to gain from threads; on a shared 2-core machine extra threads
    only add contention. Restored afterwards so other tests are unaffected."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""Fixtures for the training tests (torch_recdev/optim.py, csrc/kernels/embedding_autograd.cpp).
Global placement settings are saved and restored around every test by test/conftest.py."""

import pytest
import torch



@pytest.fixture(autouse=True)
def seeded_single_thread():
    """A fixed seed, and one intra-op thread: these tensors are tiny, and on a busy machine the
    thread pool costs more than ten times the work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def on_every_store(store_backend):
    """Each test runs on the embedded store and on two remote shards (test/conftest.py)."""
    yield store_backend

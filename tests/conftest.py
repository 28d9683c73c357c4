"""Settings shared by every test."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tests use tiny tensors: one intra-op thread is faster for them, and on a busy 2-core machine several
    times steadier (threads that wait for each other at every op get descheduled). Restored at the end."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

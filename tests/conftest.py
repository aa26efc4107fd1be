"""Test-wide settings: a private cache directory, and the shared published data as the mirror."""
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_data_dirs(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("STIMSIM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "stimsim-cache"))
    if SHARED_DATA.is_dir():
        monkeypatch.setenv("STIMSIM_MIRROR_DIR", str(SHARED_DATA))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small tensors on a shared 2-core machine run faster on one intra-op thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

"""Test-wide settings: a private cache directory, and the shared published data as the mirror."""
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_data_dirs(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("STIMSIM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "stimsim-cache"))
    if SHARED_DATA.is_dir():
        monkeypatch.setenv("STIMSIM_MIRROR_DIR", str(SHARED_DATA))

"""Figure plumbing shared by every plot: a headless pyplot, and atomic PNG writes."""
from __future__ import annotations

from pathlib import Path

from stimsim.utilities.io import atomic_save


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi: int = 120) -> Path:
    """Write ``fig`` as a PNG at ``path`` atomically, then close it."""
    path = atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
    pyplot().close(fig)
    return path

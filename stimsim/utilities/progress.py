"""Telling the user which phase a long command has reached: one line on stderr per phase."""
from __future__ import annotations

import sys

from tqdm import tqdm


def write_line(text: str, file=None) -> None:
    """Print ``text`` as a line of its own on ``file`` (stderr): a progress bar that is showing is cleared first
    and drawn again below it, so that the two never share a line."""
    file = file or sys.stderr
    tqdm.write(text, file=file)
    file.flush()


def report_phase(message: str, enabled: bool = True) -> None:
    """Print ``stimsim: MESSAGE`` on stderr (progress bars show the phases that loop)."""
    if enabled:
        write_line(f"stimsim: {message}")

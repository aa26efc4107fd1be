"""Telling the user which phase a long command has reached: one line on stderr per phase."""
from __future__ import annotations

import sys


def report_phase(message: str, enabled: bool = True) -> None:
    """Print ``stimsim: MESSAGE`` on stderr (progress bars show the phases that loop)."""
    if enabled:
        print(f"stimsim: {message}", file=sys.stderr, flush=True)

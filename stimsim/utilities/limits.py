"""Bounds on what a request may ask for: seeds within numpy's range, and memory estimated before allocating.

A count given on the command line (sessions, trials, resamples) sets the size of arrays and tables; the
memory a request needs is estimated from it first, and a request beyond what this machine has available is
refused with the estimate and the limit, instead of growing until the system kills it.

>>> check_seed("--seed", 7)
7
>>> format_bytes(3 * 2**30)
'3.0 GiB'
"""
from __future__ import annotations

import os

from stimsim.utilities.errors import ConfigError

#: Largest seed accepted: every seed is valid for numpy's generators and for scikit-learn's random_state.
MAX_SEED = 2**32 - 1


def check_seed(name: str, seed) -> int:
    """``seed`` if it is an integer in 0..MAX_SEED, else ConfigError naming ``name`` (an option or key)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{name} must be an integer from 0 to {MAX_SEED} (2**32 - 1), got {seed!r}")
    return seed


def available_memory_bytes() -> int:
    """Memory this process may still take: the kernel's MemAvailable (Linux), else the free physical pages,
    else all physical memory — and no more than what a cgroup (container) limit leaves."""
    limit = None
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    limit = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    if limit is None:
        for pages in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
            try:
                limit = os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
                break
            except (ValueError, OSError, AttributeError):
                continue
    cgroup = _cgroup_room()
    if cgroup is not None:
        limit = cgroup if limit is None else min(limit, cgroup)
    return int(limit) if limit is not None else 2**40


def _cgroup_room() -> int | None:
    """Bytes left under a cgroup v2 memory limit, or None without one."""
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as handle:
            text = handle.read().strip()
        if text == "max":
            return None
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as handle:
            return max(int(text) - int(handle.read().strip()), 0)
    except (OSError, ValueError):
        return None


def check_memory(what: str, needed_bytes: float, lower: str) -> None:
    """Refuse (ConfigError) a request whose estimated memory ``needed_bytes`` exceeds what is available;
    ``what`` names the request, ``lower`` what to lower (an option)."""
    limit = available_memory_bytes()
    if needed_bytes > limit:
        raise ConfigError(f"{what} needs about {format_bytes(needed_bytes)} of memory, more than the "
                          f"{format_bytes(limit)} this machine has available; lower {lower}")


def format_bytes(count: float) -> str:
    """``count`` bytes in KiB … PiB, one decimal (beyond PiB, in PiB)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024:
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.3g} PiB"

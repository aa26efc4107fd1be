"""Natural order of identifiers for people: numbers inside ids compare as numbers, so electrode "3"
comes before "10" and "elec2" before "elec10".

>>> sorted(["10", "3", "b", "a2", "a10"], key=natural_key)
['3', '10', 'a2', 'a10', 'b']
"""
from __future__ import annotations

import re

_DIGITS = re.compile(r"(\d+)")


def natural_key(value) -> tuple:
    """Sort key of ``value``'s text: runs of digits as integers, the rest as text (text parts and
    number parts alternate, starting with text, so any two keys compare)."""
    parts = _DIGITS.split(str(value))
    return tuple(int(part) if i % 2 else part for i, part in enumerate(parts))


def repeated(values, at_most: int | None = None) -> list:
    """The values (hashable) given more than once, each once, in the order their second occurrence comes; the
    first ``at_most`` of them (None: all).

    >>> repeated(["a", "b", "b", "a", "b"])
    ['b', 'a']
    """
    seen, again = set(), {}
    for value in values:
        if value in seen:
            again[value] = None
        seen.add(value)
    return list(again)[:at_most]


def naturally_ordered(record):
    """``record`` with the keys of every dict (recursively) in natural order, for JSON written
    without ``sort_keys`` (which would put "10" before "3")."""
    if isinstance(record, dict):
        return {key: naturally_ordered(record[key]) for key in sorted(record, key=natural_key)}
    if isinstance(record, (list, tuple)):
        return [naturally_ordered(item) for item in record]
    return record

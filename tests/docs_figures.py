"""The figures the documentation's tables quote, read so that tests can check them against the runs that compute
them: a number in the docs is one that an executed test or example gives."""
import re
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _number(text: str) -> float:
    return float(text.replace("−", "-"))


def numbers(text: str) -> list[float]:
    """Every number in ``text`` (typographic minus signs included; not the digits of a name such as MobileNetV2),
    in order."""
    return [_number(x) for x in re.findall(r"(?<![\w.])[−-]?\d+(?:\.\d+)?(?:e[−-]?\d+)?", text)]


def table_rows(path: Path) -> list[list[str]]:
    """The rows of every Markdown table in ``path``, header rows included, each a list of stripped cells."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]


def row_label(path: Path, matches: Callable[[str], bool]) -> str:
    """The first cell of the first table row in ``path`` whose first cell, bold marks stripped, ``matches``: the
    label :func:`table_cell` takes."""
    for row in table_rows(path):
        if matches(row[0].strip("*")):
            return row[0]
    raise AssertionError(f"{path.name} has no table row whose label matches {matches}")


def table_cell(path: Path, row_label: str, column: str) -> list[float]:
    """The numbers in the cell of row ``row_label`` (its first cell) and column ``column`` (a header cell of the
    same table) of the Markdown tables in ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header = None
    for line in lines:
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif cells[0] == row_label and column in header:
            return numbers(cells[header.index(column)])
    raise AssertionError(f"{path.name} has no table row {row_label!r} with a column {column!r}")

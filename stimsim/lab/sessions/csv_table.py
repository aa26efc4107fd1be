"""CSV session tables: one row per trial, a header of column names, every value read as text."""
from __future__ import annotations

import csv

import pandas as pd

from stimsim.lab.sessions.formats import SessionFormat, register_session_format
from stimsim.utilities.errors import FileFormatError
from stimsim.utilities.ordering import repeated


@register_session_format("CSV")
class CSVSessions(SessionFormat):
    """A CSV table (UTF-8); a column named twice in the header is refused (pandas would rename it)."""

    suffixes = (".csv",)

    def read(self, path):
        try:
            table = pd.read_csv(path, dtype=str, keep_default_na=False)
        except pd.errors.EmptyDataError:
            raise FileFormatError(path, "empty session: the file holds no table (no header, no rows)") from None
        except UnicodeDecodeError as exc:
            around = exc.object[max(exc.start - 8, 0):exc.start + 8]
            raise FileFormatError(path, f"not UTF-8 text ({exc.reason}: {around!r}); stimsim reads CSV tables in "
                                        "UTF-8: save the table as UTF-8 (in Excel: 'CSV UTF-8')") from None
        except pd.errors.ParserError as exc:
            raise FileFormatError(path, f"not a readable CSV table ({str(exc).strip()}); stimsim reads values separated "
                                        f"by commas, with '.' as the decimal mark") from None
        with open(path, newline="", encoding="utf-8") as handle:  # pandas renames a repeated column (x, x.1)
            header = next(csv.reader(handle), [])
        twice = sorted(repeated(header))
        if twice:
            raise FileFormatError(path, f"the header names column(s) {twice} more than once; give each column once")
        if not isinstance(table.index, pd.RangeIndex):  # pandas makes the values beyond the header an index
            longer = _rows_longer_than(path, len(header))
            shown = ", ".join(str(row) for row, _ in longer[:5])
            shown += f" (+{len(longer) - 5} more)" if len(longer) > 5 else ""
            raise FileFormatError(path, f"row(s) {shown} hold more values than the header's {len(header)} columns "
                                        f"(row {longer[0][0]}: {longer[0][1]}): a decimal comma ('50,5' for 50.5), a "
                                        "comma in an unquoted value or a separator at the end of each line? stimsim "
                                        "reads values separated by commas, with '.' as the decimal mark; quote a "
                                        "value that holds a comma")
        fields = _unfinished_last_line(path)
        if len(table) and fields is not None and fields < len(header):
            raise FileFormatError(path, f"the last line (row {len(table)}) holds {fields} of the header's {len(header)} "
                                        "values and no line end: the file looks cut off while it was written; "
                                        "copy it again from the rig, or remove the incomplete trial")
        return table, None, None


def _rows_longer_than(path, n_columns: int) -> list[tuple[int, int]]:
    """(data row, number of values) of every row holding more values than the header's ``n_columns`` (rows counted
    from 1 after the header, blank lines skipped as pandas skips them)."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = (fields for fields in csv.reader(handle) if fields)
        next(rows, None)
        return [(row, len(fields)) for row, fields in enumerate(rows, start=1) if len(fields) > n_columns]


def _unfinished_last_line(path) -> int | None:
    """The number of values on the file's last line when the file does not end with a line end, else None."""
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(max(0, size - 65536))
        tail = handle.read()
    if not tail or tail.endswith((b"\n", b"\r")):
        return None
    last = tail.splitlines()[-1].decode("utf-8", errors="replace")
    return len(next(csv.reader([last]), []))

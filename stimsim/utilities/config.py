"""Reading TOML files: a syntax error or a file that is not UTF-8 names the file and the problem. What a file
may hold is declared by its file model (:mod:`stimsim.utilities.filemodels`)."""
from __future__ import annotations

import tomllib
from pathlib import Path

from stimsim.utilities.errors import FileFormatError


def load_toml(path) -> dict:
    """Parse a TOML file; a syntax error names the file and the problem."""
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"{path} is a directory; give a configuration file (TOML), e.g. one of those in "
                                "experiments/")
    if not path.is_file():
        raise FileNotFoundError(f"configuration file not found: {path}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark (some Windows editors) is dropped
    except UnicodeDecodeError as exc:
        raise FileFormatError(path, f"not UTF-8 text (byte {exc.start}: {exc.reason}); save the file as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise FileFormatError(path, f"invalid TOML ({exc})") from None

"""Reports as data: sections of paragraphs, figures, tables and parameter listings, rendered by Jinja2
templates (shipped as package data) into one self-contained HTML file and a PDF of the same content.

Images are embedded as base64 PNG data URIs, so ``report.html`` can be mailed or copied to the rig
without any side files. The PDF is printed from the same HTML by WeasyPrint. Both files are made before
either replaces an earlier one (a killed process leaves the old pair or the new one).

>>> report = Report("Plan", sections=[Section("Sites", [Paragraph("Two sites.")])])
>>> "Two sites." in report.to_html()
True
"""
from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Union

import numpy as np

from stimsim.utilities.io import atomic_write_bytes, atomic_write_text, save_together, software_versions

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: A table cell of text longer than this (characters) is a sentence, read from the left (:attr:`Table.text_columns`).
SENTENCE_CHARS = 24


def png_data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for PNG bytes (refuses anything that is not a PNG)."""
    if not isinstance(png, (bytes, bytearray)) or not bytes(png).startswith(_PNG_SIGNATURE):
        raise ValueError("expected PNG bytes (they must start with the PNG signature)")
    return "data:image/png;base64," + base64.b64encode(bytes(png)).decode("ascii")


@dataclass(frozen=True)
class Image:
    """A PNG image; ``width_mm`` sets its printed and displayed width (None: the figure's own size,
    at most the page width). Used on its own as a figure (with ``caption``) or inside a table cell. ``css_class``
    "first-page" prints a figure small enough to share the first PDF page with the title and a few paragraphs."""

    png: bytes
    caption: str = ""
    alt: str = ""
    width_mm: float | None = None
    css_class: str = ""

    def __post_init__(self):
        png_data_uri(self.png)  # validates
        if self.width_mm is not None and not (math.isfinite(self.width_mm) and self.width_mm > 0):
            raise ValueError(f"width_mm must be a finite number > 0 (mm) or None, got {self.width_mm!r}")

    @property
    def data_uri(self) -> str:
        return png_data_uri(self.png)


@dataclass(frozen=True)
class Paragraph:
    """A paragraph of plain text (escaped when rendered); ``css_class`` "warning" draws it in a warning box."""

    text: str
    css_class: str = ""


Cell = Union[str, int, float, bool, None, Image, tuple]


@dataclass(frozen=True)
class Table:
    """A table with a header row; a cell is text, a number (formatted to ``digits`` significant digits),
    None (shown as "–"), an :class:`Image`, or a tuple of images (shown side by side)."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    caption: str = ""
    digits: int = 3
    css_class: str = ""

    def __post_init__(self):
        object.__setattr__(self, "columns", tuple(str(c) for c in self.columns))
        object.__setattr__(self, "rows", tuple(tuple(r) for r in self.rows))
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(f"table row {i} has {len(row)} cells, the header has {len(self.columns)}")

    @property
    def text_columns(self) -> tuple[bool, ...]:
        """Per column, whether it is a column of text (every cell text or None) holding a sentence (a text cell longer
        than :data:`SENTENCE_CHARS`): its short cells then read from the left too, so that a column of names or
        sentences lines up. In other columns only a sentence reads from the left."""
        return tuple(all(row[i] is None or isinstance(row[i], str) for row in self.rows)
                     and any(isinstance(row[i], str) and len(row[i]) > SENTENCE_CHARS for row in self.rows)
                     for i in range(len(self.columns)))

    @classmethod
    def from_dataframe(cls, frame, caption: str = "", digits: int = 3, css_class: str = "") -> "Table":
        """A table of a pandas DataFrame's columns (the index is dropped; keep it as a column if needed)."""
        rows = [tuple(_plain(v) for v in row) for row in frame.itertuples(index=False, name=None)]
        return cls(tuple(frame.columns), tuple(rows), caption=caption, digits=digits, css_class=css_class)


@dataclass(frozen=True)
class Listing:
    """Name → value pairs (parameters, summary numbers); nested dicts are flattened as ``a.b``; ``digits`` None shows
    every digit of a float (a parameter as it was given)."""

    items: dict
    caption: str = ""
    digits: int | None = 4

    def flat(self) -> list[tuple[str, Any]]:
        return _flatten(self.items)


Block = Union[Paragraph, Image, Table, Listing]


@dataclass
class Section:
    """A titled part of a report holding blocks in order."""

    title: str
    blocks: list = field(default_factory=list)

    def __post_init__(self):
        for block in self.blocks:
            if not isinstance(block, (Paragraph, Image, Table, Listing)):
                raise TypeError(f"section {self.title!r}: a block must be a Paragraph, Image, Table or Listing, "
                                f"got {type(block).__name__}")


@dataclass
class Report:
    """A whole report: title, optional subtitle, sections; ``parameters`` (everything the result depends
    on) and the software versions are appended as the last sections."""

    title: str
    sections: list[Section] = field(default_factory=list)
    subtitle: str = ""
    parameters: dict = field(default_factory=dict)
    software: dict | None = None

    def context(self) -> dict:
        return {
            "title": self.title,
            "subtitle": self.subtitle,
            "sections": self.sections,
            "parameters": Listing(self.parameters, caption="Every parameter of this result", digits=None)
            if self.parameters else None,
            "software": Listing(self.software if self.software is not None else software_versions()),
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    def to_html(self) -> str:
        """The report as one self-contained HTML document."""
        return _environment().get_template("report.html.j2").render(**self.context())

    def to_pdf(self, html: str | None = None) -> bytes:
        """The same content as PDF (WeasyPrint, print stylesheet of the template)."""
        from weasyprint import HTML

        return HTML(string=html if html is not None else self.to_html()).write_pdf()

    def savers(self, stem: str = "report") -> dict:
        """``{stem}.html`` and ``{stem}.pdf``, rendered now, as savers (name → ``save_fn(path)``) for
        :func:`stimsim.utilities.io.save_together` or :meth:`stimsim.utilities.io.ResultSet.write_together`."""
        html = self.to_html()
        pdf = self.to_pdf(html)
        return {f"{stem}.html": lambda path: atomic_write_text(path, html),
                f"{stem}.pdf": lambda path: atomic_write_bytes(path, pdf)}

    def write(self, directory, stem: str = "report") -> tuple[Path, Path]:
        """Write ``DIR/{stem}.html`` and ``DIR/{stem}.pdf`` together (:func:`~stimsim.utilities.io.save_together`:
        both are made before either replaces an earlier one); returns their paths."""
        html_path, pdf_path = save_together(directory, self.savers(stem))
        return html_path, pdf_path


# --- rendering helpers ------------------------------------------------------------------------------
def format_value(value, digits: int | None = 3) -> str:
    """Text of a cell: floats to ``digits`` significant digits (no exponent for ordinary magnitudes; None: every
    digit, the shortest text that reads back as the same float), NaN and None as "–", booleans as yes/no, an empty
    list or mapping as "none"."""
    value = _plain(value)
    if value is None:
        return "–"
    if isinstance(value, (list, tuple, dict)) and not value:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–" if math.isnan(value) else ("∞" if value > 0 else "−∞")
        if value == 0:
            return "0"
        if digits is None:
            return repr(value).replace("-", "−")
        if 1e-3 <= abs(value) < 1e6:
            decimals = max(digits - 1 - int(math.floor(math.log10(abs(value)))), 0)
            return f"{value:.{decimals}f}".replace("-", "−")
        return f"{value:.{digits - 1}e}".replace("-", "−")
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v, digits) for v in value)
    return str(value)


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    return value


def _flatten(items: dict, prefix: str = "") -> list[tuple[str, Any]]:
    flat = []
    for key, value in items.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.extend(_flatten(value, name + "."))
        else:
            flat.append((name, value))
    return flat


def _kind(block) -> str:
    return {Paragraph: "paragraph", Image: "image", Table: "table", Listing: "listing"}[type(block)]


def _is_image(value) -> bool:
    return isinstance(value, Image)


def _is_image_group(value) -> bool:
    return isinstance(value, tuple) and len(value) > 0 and all(isinstance(v, Image) for v in value)


_ENVIRONMENT = None


def _breakable(name) -> "Markup":
    """A column name, escaped, that a narrow page may wrap after each underscore (``delta_auc_low``)."""
    from markupsafe import Markup, escape

    return Markup(str(escape(str(name))).replace("_", "_<wbr>"))


def _environment():
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        from jinja2 import Environment, PackageLoader, StrictUndefined

        env = Environment(loader=PackageLoader("stimsim.report", "templates"), autoescape=True,
                          undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        env.filters["fmt"] = format_value
        env.filters["breakable"] = _breakable
        env.filters["kind"] = _kind
        env.tests["image"] = _is_image
        env.tests["image_group"] = _is_image_group
        env.globals["SENTENCE_CHARS"] = SENTENCE_CHARS
        _ENVIRONMENT = env
    return _ENVIRONMENT

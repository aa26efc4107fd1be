"""Files as typed models (pydantic): every table refuses unknown keys, every number has its range,
and a problem becomes one message that names the file, the table, the key and what is allowed.

Experiment files (:mod:`stimsim.paradigms.schema`) and model directories' ``model.json``
(:mod:`stimsim.models.topographic`) are declared with :class:`FileModel` tables.

>>> from typing import Annotated
>>> from pydantic import Field
>>> class Disc(FileModel):
...     radius_mm: Annotated[float, Field(gt=0)]
>>> validate(Disc, {"radius_mm": 0.5}, "disc.toml").radius_mm
0.5
>>> validate(Disc, {"radius_mm": -1.0}, "disc.toml")
Traceback (most recent call last):
...
stimsim.utilities.errors.ConfigError: disc.toml: 'radius_mm' must be > 0.0, got -1.0
>>> validate(Disc, {"radius_mm": 1.0, "colour": "red"}, "disc.toml")
Traceback (most recent call last):
...
stimsim.utilities.errors.ConfigError: disc.toml: unknown key 'colour'; allowed: ['radius_mm']
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from stimsim.utilities.errors import ConfigError, FileFormatError
from stimsim.utilities.file_kinds import wrong_kind_hint

#: Non-empty, printable text (no control characters such as NUL or newline).
TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*[^\x00-\x20\x7f][^\x00-\x1f\x7f]*$"
Text = Annotated[str, Field(min_length=1, pattern=TEXT_PATTERN)]


def _plain_name(name: str) -> str:
    if any(character in name for character in "/\\") or name in (".", ".."):
        raise ValueError(f"'name' must be a plain name without '/' or '\\' (it names files and folders), got {name!r}")
    return name


#: The ``name`` of a model, a training run or a build: text that can name a file or folder (no path).
PlainName = Annotated[Text, AfterValidator(_plain_name)]


class FileModel(BaseModel):
    """A table of a file: strict types (no text for numbers), unknown keys refused, NaN and
    infinity refused. Built in code (``Model(key=value)``), a bad value is a ``ConfigError`` naming
    :attr:`table` and the key, as it would be in a file."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True,
                              use_attribute_docstrings=True)
    #: The table's name in files, for messages about a model built in code (e.g. ``"sequences"``).
    table: ClassVar[str] = ""

    def __init__(self, **values):
        try:
            super().__init__(**values)
        except ValidationError as exc:
            where = f"[{self.table}]" if self.table else ""
            raise ConfigError(describe_error(_first_error(exc.errors()), type(self), where)) from None

    # validating a file builds nested tables without this constructor, so their errors keep their place in the file
    __init__.__pydantic_base_init__ = True

    def to_dict(self) -> dict:
        """The table as plain values (JSON-ready: tuples as lists)."""
        return self.model_dump(mode="json")


def validate(model: type[BaseModel], raw, where: str, command: str | None = None):
    """``raw`` checked against ``model``; the first problem is a ``ConfigError`` naming ``where``,
    the table, the key and what is allowed, and the file's kind when it is recognisably another than the one
    ``command`` reads (:func:`~stimsim.utilities.file_kinds.wrong_kind_hint`)."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        hint = "" if command is None else wrong_kind_hint(raw, command)
        raise ConfigError(describe_error(_first_error(exc.errors()), model, where) + hint) from None


def validate_file(model: type[BaseModel], raw, path):
    """``raw`` (read from the file ``path``) checked against ``model``; the first problem is a
    ``FileFormatError`` naming the file, the table, the key and what is allowed."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise FileFormatError(Path(path), describe_error(_first_error(exc.errors()), model, "")) from None


#: What each type error asks for.
_EXPECTED = {"float_type": "a number", "int_type": "an integer", "string_type": "text", "bool_type": "true or false",
             "list_type": "a list", "model_type": "a table", "dict_type": "a table", "finite_number": "a finite number"}
#: The names pydantic gives the members of a union of plain values (an electrode id: ``int | Text``).
_PLAIN_MEMBER = re.compile(r"(constrained-)?(int|float|str|bool)")


def _first_error(errors: list) -> dict:
    """The first of pydantic's ``errors``; for a value that no member of a union of plain values takes, one error at
    the key itself: the member whose type the value has says what is wrong, else every member's type is named."""
    first = errors[0]
    loc = tuple(first["loc"])
    if not loc or not isinstance(loc[-1], str) or not _PLAIN_MEMBER.fullmatch(loc[-1]):
        return first
    members = [error for error in errors if tuple(error["loc"][:-1]) == loc[:-1]]
    typed = [error for error in members if error["type"] not in _EXPECTED]
    if typed:
        return {**typed[0], "loc": loc[:-1]}
    return {**first, "loc": loc[:-1], "type": "union_type",
            "ctx": {"expected": " or ".join(dict.fromkeys(_EXPECTED[error["type"]] for error in members))}}


def describe_error(error: dict, model: type[BaseModel], where: str) -> str:
    """One pydantic error as ``"<where> [table]: 'key' must be ..., got ..."`` (``where`` may be
    empty, e.g. when the error names the file itself)."""
    raw_loc = list(error["loc"])
    loc, current = [], [model]
    for part in raw_loc:  # drop the tags pydantic adds for the chosen member of a union
        members = _step(current, part)
        if members is None:
            continue
        loc.append(part)
        current = members
    names = [i for i, part in enumerate(loc) if isinstance(part, str)]
    key = loc[names[-1]] if names else ""
    table = _location(loc[:names[-1]] if names else loc)
    if error["type"] == "value_error" and names and _is_plain_key(model, loc[:names[-1]], key):
        problem = str(error["ctx"]["error"])  # a check of one key (a field validator)
    elif error["type"] == "value_error":  # a check of a whole table (a model validator): the table is the place
        table, problem = _location(loc), str(error["ctx"]["error"])
    elif error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        table = _location(loc)
        ctx = error.get("ctx", {})
        problem = (f"'method' must be one of [{ctx.get('expected_tags')}], got {ctx.get('tag')!r}"
                   if error["type"] == "union_tag_invalid" else "missing required key 'method'")
    else:
        problem = _problem(error, model, raw_loc, key)
    place = " ".join(part for part in (where, f"[{table}]" if table else "") if part)
    return f"{place}: {problem}" if place else problem


def _problem(error: dict, model: type[BaseModel], raw_loc: list, key) -> str:
    kind, ctx, given = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed(model, raw_loc[:-1])
        return f"unknown key {key!r}" + (f"; allowed: {allowed}" if allowed else "")
    if kind == "missing":
        return f"missing required key {key!r}"
    bounds = {"greater_than": "> {gt}", "greater_than_equal": ">= {ge}", "less_than": "< {lt}",
              "less_than_equal": "<= {le}"}
    if kind in bounds:
        problem = f"{key!r} must be {bounds[kind].format(**ctx)}, got {given!r}"
        fraction = kind in ("less_than", "less_than_equal") and ctx.get("lt", ctx.get("le")) == 1 and \
            _is_proportion(key)
        if fraction and isinstance(given, (int, float)) and not isinstance(given, bool) and 1 < given <= 100:
            problem += f"; it is a fraction: {given / 100:g} for {given:g} %"  # a percentage given
        return problem
    if kind == "literal_error":
        return f"{key!r} must be one of {ctx.get('expected')}, got {given!r}"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") != TEXT_PATTERN:
        return f"{key!r} must match {ctx.get('pattern')!r}, got {given!r}"
    if kind == "string_pattern_mismatch":
        return f"{key!r} must be printable text without control characters (NUL, newline, ...), not blank; " \
               f"got {given!r}"
    if kind == "string_too_short":
        return f"{key!r} must not be empty, got {given!r}"
    if kind == "too_short":
        return f"{key!r} must hold at least {ctx.get('min_length')} item(s), got {given!r}"
    if kind == "too_long":
        return f"{key!r} must hold at most {ctx.get('max_length')} item(s), got {given!r}"
    expected = ctx.get("expected") if kind == "union_type" else _EXPECTED.get(kind)
    if expected:
        return f"{key!r} must be {expected}, got {given!r}"
    return f"{key!r}: {error['msg']}, got {given!r}"


def _is_proportion(key) -> bool:
    """Whether ``key`` names a proportion (a fraction, the lapse rate, a confidence level), for which a value in
    percent is a likely slip; other keys bounded by 1 (momentum, a learning rate, a reliability) are not."""
    return isinstance(key, str) and (key.endswith("fraction") or key in ("ci", "lapse_rate"))


def _location(parts) -> str:
    """``("sites", "localizer", "sets", 0)`` → ``"sites.localizer.sets[0]"``."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _models_in(annotation) -> list:
    """The BaseModel classes inside ``X``, ``X | None``, ``list[X]``, unions or ``Annotated[...]``."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [found for arg in typing.get_args(annotation) for found in _models_in(arg)]


def _step(current: list, part):
    """The models one location step down (a field of the current model, a list position, or the
    union member a tag names); None when ``part`` is a union tag rather than a key."""
    if isinstance(part, int):
        return current
    tagged = [m for m in current if "method" in m.model_fields
              and part in getattr(m.model_fields["method"].annotation, "__args__", ())]
    if tagged and len(current) > 1:  # before the fields: a tag may also be a key of its member ("plan")
        current[:] = tagged
        return None
    fields = [m.model_fields[part] for m in current if part in m.model_fields]
    if fields:
        return _models_in(fields[0].annotation)
    return current


def _is_plain_key(model: type[BaseModel], loc, key) -> bool:
    """Whether ``key`` of the table at ``loc`` holds a value rather than a table."""
    current = [model]
    for part in loc:
        step = _step(current, part)
        if step is not None:
            current = step
    fields = [m.model_fields[key] for m in current if key in m.model_fields]
    return bool(fields) and not _models_in(fields[0].annotation)


def _allowed(model: type[BaseModel], loc) -> list[str]:
    """Keys allowed in the table at ``loc``."""
    current = [model]
    for part in loc:
        step = _step(current, part)
        if step is not None:
            current = step
    return sorted(current[0].model_fields) if len(current) == 1 else []

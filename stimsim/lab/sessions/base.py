"""Behavioural sessions in: NWB ``trials`` tables and CSV / HDF5 trial tables, validated whole.

One row per trial of the 2AFC image-sequence task (Mehrer et al. 2025, arXiv 2510.03684): the
sequence of site ``electrode`` is shown at ``step`` 0..6 (0 = the "low" end, 6 = the "high" end),
the site is stimulated or not (``stimulated_electrode`` = the electrode id, or ``"sham"``), and the
animal chooses ``"low"`` or ``"high"``. Column names and their meaning: :data:`COLUMNS`.

A file with any problem is refused whole (:class:`~stimsim.utilities.errors.FileFormatError` naming the file,
and every problem's row and column), never half-loaded. Labs that name their columns differently
pass a mapping ``{lab_name: stimsim_name}`` (:func:`parse_column_mapping`, :func:`load_column_mapping`);
labs that code values differently (choices 0/1, sham as electrode -1 or current -1) pass a value mapping
``{stimsim_column: {lab_code: stimsim_value}}`` (:func:`value_mapping`, :data:`VALUE_TARGETS`).

The formats are read by one module each (:mod:`~stimsim.lab.sessions.csv_table`, :mod:`~stimsim.lab.sessions.nwb`,
:mod:`~stimsim.lab.sessions.hdf5`) behind a registry (:mod:`~stimsim.lab.sessions.formats`).

Over 500 lines: reading a session is one contract: the column and value mappings and the whole-file validation
share one way of reporting every bad row, so they stay together.
"""
from __future__ import annotations

import functools
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np
import pandas as pd

from stimsim.lab.sessions.formats import session_format_of
from stimsim.utilities.errors import ConfigError, FileFormatError
from stimsim.utilities.ordering import natural_key

#: Choices of the 2AFC between the two ends of a sequence.
CHOICES = ("low", "high")

#: Value of ``stimulated_electrode`` on sham trials.
SHAM = "sham"

#: Columns of a session table: name -> (required, meaning).
COLUMNS = {
    "electrode": (True, "site whose image sequence is shown (text id, e.g. '17')"),
    "step": (True, "position along the sequence, integer 0..n_steps-1 (0 = 'low' end)"),
    "stimulated_electrode": (True, "electrode id stimulated on this trial, or 'sham'"),
    "current_uA": (True, "stimulation current, µA; 0 on sham trials"),
    "choice": (True, "'low' or 'high'"),
    "start_time": (False, "trial start, s"),
    "stop_time": (False, "trial stop, s"),
    "stimulus_id": (False, "image id, e.g. '17_seq0_step3'"),
    "sequence": (False, "index of the site's sequence (integer)"),
    "correct": (False, "choice matches the nearer end (bool; the centre step has none: empty or any value)"),
    "subject_id": (False, "subject (tables; NWB: subject.subject_id). Default 'subject'"),
    "session_id": (False, "session (tables; NWB: session_id). Default: the file name"),
}
REQUIRED = tuple(name for name, (required, _) in COLUMNS.items() if required)

#: The stimulator's settings a rig's trial list gives beside the current (``stimsim plan``'s rig/trials.csv), and
#: their units: kept as numbers (NaN where a row gives none, as sham rows do) when a file has them, so that the
#: analysis can check the protocol the trials ran against a plan's.
PROTOCOL_COLUMNS = {"frequency_Hz": "Hz", "pulse_width_ms": "ms", "train_ms": "ms", "train_onset_ms": "ms"}


def planned_setting(column: str, planned: float, unit: str) -> str:
    """How a message states the plan's value of a protocol column (in ``unit``): "the plan stimulates at 200 Hz",
    or for the train's onset "the plan's trains start at -20 ms from image onset"."""
    if column == "train_onset_ms":
        return f"the plan's trains start at {float(planned):g} {unit} from image onset"
    return f"the plan stimulates at {float(planned):g} {unit}"


def off_protocol(values, stimulated, planned: float) -> np.ndarray:
    """Which trials are stimulation trials (``stimulated``) whose ``values`` differ from the protocol's ``planned``
    value (a missing value, NaN, differs too)."""
    return np.asarray(stimulated) & ~np.isclose(np.asarray(values, dtype=float), float(planned), rtol=1e-9, atol=0.0)

#: Below this current (µA) a stimulated trial's current is almost surely in mA (microstimulation uses 5–200 µA); above
#: :data:`~stimsim.stimulation.electrical.MAX_CURRENT_UA` (the highest stimsim accepts), in nA. Both are refused.
MIN_CURRENT_UA = 1.0

#: Column names that hold a current without µA in the name: refused with an explanation.
_UNITLESS_CURRENT = ("current", "current_mA", "current_ma", "amplitude", "current_A", "current_nA")

#: How many problems one error message lists.
_MAX_PROBLEMS_LISTED = 10

#: Columns whose lab codes a value mapping may translate, and the stimsim values a code may stand for.
#: ``choice``: the column then holds only the mapped codes. ``stimulated_electrode``: codes that mark a
#: sham trial (other values stay electrode ids). ``current_uA``: currents (numbers) that mark a sham
#: trial; such a row becomes a sham trial at 0 µA.
VALUE_TARGETS = {"choice": CHOICES, "stimulated_electrode": (SHAM,), "current_uA": (SHAM,)}
#: The ``current_uA`` or ``stimulated_electrode`` code of an empty or NaN cell (a rig that leaves a sham trial's
#: current or stimulated channel blank).
EMPTY_CELL = "nan"


def parse_column_mapping(text: str) -> dict[str, str]:
    """``"lab_name=stimsim_name,..."`` -> ``{lab_name: stimsim_name}`` (command-line form)."""
    mapping = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        lab, sep, ours = (piece.strip() for piece in item.partition("="))
        if not sep or not lab or not ours:
            raise ConfigError(f"--columns: {item!r} is not of the form lab_name=stimsim_name")
        if lab in mapping:
            raise ConfigError(f"--columns: lab column {lab!r} is given twice (onto {mapping[lab]!r} and {ours!r}); a "
                              "lab column maps onto one stimsim column")
        mapping[lab] = ours
    return _checked_mapping(mapping, "--columns")


def load_column_mapping(path) -> dict[str, str]:
    """Read ``[columns]`` (``lab_name = "stimsim_name"``) from a TOML file (which may also hold
    ``[values.COLUMN]`` tables, :func:`load_value_mapping`); {} when it has only ``[values]``."""
    document = _mapping_document(path)
    if "columns" not in document:
        return {}
    if not all(isinstance(value, str) for value in document["columns"].values()):
        raise ConfigError(f"{path} [columns]: every value must be a stimsim column name (text)")
    return _checked_mapping(document["columns"], str(path))


def load_value_mapping(path) -> dict[str, dict[str, str]]:
    """Read ``[values.COLUMN]`` tables (``lab_code = "stimsim_value"``, e.g. ``[values.choice]``
    ``0 = "low"``, ``1 = "high"``) from a mapping TOML file; {} when it has none."""
    document = _mapping_document(path)
    values = document.get("values", {})
    if not isinstance(values, dict) or not all(isinstance(codes, dict) for codes in values.values()):
        raise ConfigError(f"{path} [values]: expected tables [values.COLUMN] of lab_code = \"stimsim_value\" "
                          f"entries (COLUMN one of {', '.join(VALUE_TARGETS)})")
    return _checked_values({column: dict(codes) for column, codes in values.items()}, str(path))


def _mapping_document(path) -> dict:
    from stimsim.utilities.config import load_toml

    document = load_toml(path)
    unknown = set(document) - {"columns", "values"}
    if unknown or not document or not all(isinstance(table, dict) for table in document.values()):
        raise ConfigError(f"{path}: expected a table [columns] of lab_name = \"stimsim_name\" entries and/or "
                          f"tables [values.COLUMN] of lab_code = \"stimsim_value\" entries"
                          + (f"; unknown keys {sorted(unknown)}" if unknown else ""))
    return document


def parse_value_mapping(text: str) -> dict[str, dict[str, str]]:
    """``"column:code=value,code=value"`` -> ``{column: {code: value}}`` (command-line form, one
    column per ``--values``)."""
    column, sep, items = (piece.strip() for piece in text.partition(":"))
    codes = {}
    for item in filter(None, (part.strip() for part in items.split(","))):
        code, equals, value = (piece.strip() for piece in item.partition("="))
        if not equals or not code or not value:
            raise ConfigError(f"--values: {item!r} is not of the form lab_code=stimsim_value")
        if code in codes:
            raise ConfigError(f"--values {column}: code {code!r} is given twice")
        codes[code] = value
    if not sep or not column or not codes:
        raise ConfigError(f"--values: {text!r} is not of the form column:lab_code=stimsim_value,... "
                          f"(e.g. choice:0=low,1=high)")
    return _checked_values({column: codes}, "--values")


def value_mapping(specs=(), mapping_file: str | None = None) -> dict[str, dict[str, str]]:
    """The value mapping of the command line: each ``--values column:code=value,...`` and the
    ``[values.COLUMN]`` tables of the ``--columns`` TOML file; a column given twice is refused."""
    parts = [load_value_mapping(mapping_file)] if mapping_file and mapping_file.endswith(".toml") else []
    parts += [parse_value_mapping(spec) for spec in specs or ()]
    merged: dict[str, dict[str, str]] = {}
    for part in parts:
        for column, codes in part.items():
            if column in merged:
                raise ConfigError(f"value mapping: column {column!r} is given twice (--values and/or the TOML "
                                  f"file); give all its codes once")
            merged[column] = codes
    return merged


def _checked_values(values: dict, where: str) -> dict[str, dict[str, str]]:
    """Every column one of :data:`VALUE_TARGETS`, every target allowed for it, codes distinct (case
    ignored, numbers compared as numbers: 1 = 1.0), current codes numbers. Codes are kept as text, case-folded."""
    checked = {}
    for column, codes in values.items():
        if column not in VALUE_TARGETS:
            raise ConfigError(f"{where}: no value mapping for column {column!r}; columns with one: "
                              f"{', '.join(VALUE_TARGETS)}")
        if not codes:
            raise ConfigError(f"{where} {column}: the value mapping lists no code")
        allowed = VALUE_TARGETS[column]
        folded, compared = {}, {}  # compared: the code's key (:func:`_code_key`) -> the code as given
        for code, value in codes.items():
            if isinstance(value, dict):  # TOML reads an unquoted 1.0 = "low" as a table 1 holding 0 = "low"
                raise ConfigError(f"{where} {column}: code {code!r} holds a table {value!r}, not a value; in a TOML "
                                  "file quote a code with a '.' (\"1.5\" = ...), or write 1.0 as 1: numeric codes "
                                  "compare as numbers (1 = 1.0)")
            if not isinstance(value, str) or value.lower() not in allowed:
                raise ConfigError(f"{where} {column}: code {code!r} maps onto {value!r}; allowed values: "
                                  f"{', '.join(allowed)}")
            key = str(code).strip().casefold()
            if _code_key(key) in compared:
                raise ConfigError(f"{where} {column}: code {code!r} is given twice (as {compared[_code_key(key)]!r}; "
                                  "case is ignored and numbers compare as numbers: 1 = 1.0)")
            compared[_code_key(key)] = code
            if column == "current_uA" and key != EMPTY_CELL and not np.isfinite(pd.to_numeric(key, errors="coerce")):
                raise ConfigError(f"{where} current_uA: code {code!r} is not a number; a current code is the "
                                  f"number the lab writes for a sham trial, e.g. -1, or {EMPTY_CELL} for an "
                                  "empty or NaN cell")
            if column != "current_uA" and key in allowed and key != value.lower():
                raise ConfigError(f"{where} {column}: code {code!r} is itself a stimsim value; mapping it onto "
                                  f"{value!r} would swap meanings")
            folded[key] = value.lower()
        checked[column] = folded
    return checked


def column_mapping(spec: str | None) -> dict[str, str]:
    """A mapping from the command line: a TOML file path if it ends in .toml, else ``a=b,c=d``."""
    if not spec:
        return {}
    if spec.endswith(".toml"):
        return load_column_mapping(spec)
    return parse_column_mapping(spec)


def did_you_mean(names, choices) -> str:
    """"; did you mean 'x'?" for the names with a close match among ``choices`` (difflib), else ""."""
    import difflib

    close = {name: difflib.get_close_matches(str(name), [str(c) for c in choices], n=1) for name in names}
    hints = [f"{match[0]!r} for {name!r}" if len(close) > 1 else repr(match[0])
             for name, match in close.items() if match]
    return f"; did you mean {', '.join(hints)}?" if hints else ""


def _checked_mapping(mapping: dict[str, str], where: str) -> dict[str, str]:
    unknown = sorted(set(mapping.values()) - set(COLUMNS))
    if unknown:
        raise ConfigError(f"{where}: unknown stimsim column(s) {unknown}{did_you_mean(unknown, COLUMNS)}; "
                          f"allowed: {', '.join(COLUMNS)}")
    return dict(mapping)  # several lab names may map onto one column (files from different rigs), one per file


def load_sessions(paths, columns: dict[str, str] | None = None, electrodes=None,
                  values: dict[str, dict[str, str]] | None = None, plan_sequences=None,
                  electrodes_source: str = "the plan/layout") -> pd.DataFrame:
    """Read and validate session files (``.nwb``, ``.csv``, ``.h5``/``.hdf5``) into one table.

    Parameters
    ----------
    paths
        One path or several (several sessions and subjects at once).
    columns
        ``{lab_name: stimsim_name}`` for files whose columns are named differently.
    values
        ``{stimsim_column: {lab_code: stimsim_value}}`` for files that code values differently
        (:data:`VALUE_TARGETS`; from :func:`value_mapping`). Each code must occur in at least one file.
    plan_sequences
        ``(plan_file, n_sequences, n_steps)`` of a plan
        (:func:`stimsim.analysis.comparison.load_plan_sequences`): trials of a sequence or at a step
        beyond the plan's are refused, and the centre of the sequences is the plan's.
    electrodes
        Ids the sessions may name (from a plan or an array layout); None: any.
    electrodes_source
        Where ``electrodes`` come from, as a refusal of another id names it (e.g. "the plan's sites").

    Returns
    -------
    pandas.DataFrame
        The columns of :data:`COLUMNS` (optional ones filled: ``subject_id`` 'subject', ``session_id``
        the file stem, times/sequence/stimulus_id/correct NaN or empty where absent, ``correct`` None in an empty
        cell), plus ``file`` and ``row``
        (1-based data row in its file), and those of :data:`PROTOCOL_COLUMNS` a file gives (NaN in the other files'
        rows). Any problem raises FileFormatError.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = [Path(path) for path in paths]
    if not paths:
        raise ConfigError("no session files given")
    resolved = [path.resolve() for path in paths]
    again = next((path for i, path in enumerate(paths) if resolved[i] in resolved[:i]), None)
    if again is not None:
        raise ConfigError(f"session file {again} is given twice; its trials would be counted twice")
    known = None if electrodes is None else {str(electrode) for electrode in electrodes}
    raws, file_ids = zip(*(_read_raw(path) for path in paths))
    mapping = _mapping_in_files(columns or {}, raws, paths)
    renamed = [_renamed(raw, mapping, ids, path) for raw, ids, path in zip(raws, file_ids, paths)]
    values = _checked_values(values, "value mapping") if values else {}
    _codes_in_files(values, renamed, paths)
    tables = [_validated(table, path, known, values, {ours: lab for lab, ours in mapping.items() if lab in raw.columns},
                         electrodes_source=electrodes_source)
              for table, raw, path in zip(renamed, raws, paths)]
    sessions = pd.concat(tables, ignore_index=True)
    if plan_sequences is not None:
        plan_file, n_sequences, n_steps = plan_sequences
        check_against_plan(sessions, n_sequences, n_steps, plan_file)
    steps = np.unique(sessions["step"])
    where = _where(paths)
    if steps[0] > 0:
        raise FileFormatError(where, f"column 'step': no trial at step 0 (steps found {steps[0]}..{steps[-1]}); steps "
                                     f"count from 0, the 'low' end of the sequence: subtract 1 from steps counted "
                                     f"from 1")
    if steps.size < 2:
        raise FileFormatError(where, "every trial is at step 0; a psychometric curve needs trials at 2 steps or more")
    if plan_sequences is None:
        _check_step_gaps(sessions, steps)
    _check_correct(sessions, int(steps[-1]) if plan_sequences is None else plan_sequences[2] - 1)
    stimulated = sessions["stimulated_electrode"] != SHAM
    if stimulated.all() or not stimulated.any():
        missing = "sham" if stimulated.all() else "stimulated"
        raise FileFormatError(where, f"column 'stimulated_electrode': no {missing} trial in the sessions given; an "
                                     f"effect is stimulated against interleaved sham trials")
    per_file = sessions.drop_duplicates(["file", "subject_id", "session_id"])
    duplicated = per_file.duplicated(["subject_id", "session_id"])
    if duplicated.any():
        again = per_file[duplicated].iloc[0]
        hint = ("; a session filled in from a plan's rig/trials.nwb keeps its session_id 'planned': give each day's "
                "file its own session_id (and start time) when writing it" if again["session_id"] == "planned" else
                "; the same session given twice would count its trials twice")
        raise FileFormatError(again["file"], f"session {again['session_id']!r} of subject "
                              f"{again['subject_id']!r} is also in another file given{hint}")
    _refuse_copies(sessions)
    return sessions


def check_trial_list(table: pd.DataFrame, path) -> None:
    """Check a trial list (a session's columns before any choice is made, e.g. a plan's ``rig/trials.csv``) by
    the rules a session file is checked by: one FileFormatError naming ``path``, the columns and the rows."""
    _validated(table.assign(choice=CHOICES[0]), Path(path), known=None, lab_codes=False)


def _check_step_gaps(sessions: pd.DataFrame, steps: np.ndarray) -> None:
    """Without a plan the curves span steps 0 .. the last step of the sessions: a step below it that no trial of any
    site is at would leave every site without a ΔAUC (a mistyped step, e.g. 60 for 6, or one the rig never ran), and a
    far one would size the counts by it. Refused naming the rows beyond the first gap."""
    gaps = np.flatnonzero(np.diff(steps) > 1)
    if not gaps.size:
        return
    low, high = int(steps[gaps[0]]) + 1, int(steps[gaps[0] + 1]) - 1
    missing = f"step {low}" if low == high else f"steps {low}..{high}"
    _refuse(sessions, _row_problems(sessions, sessions["step"] > high, "step",
                                    f"beyond {missing}, at which no trial of any site is: every site's curve would "
                                    f"have an empty step (a mistyped step, one the rig never ran, or too few trials?)"))


def _check_correct(sessions: pd.DataFrame, last_step: int) -> None:
    """Where a file gives ``correct``, it must agree with the choice: below the sequence's centre
    (step < last/2) "low" is correct, above it (step > (last + 1)/2) "high"; the centre step(s) have no correct
    answer and are not checked, and only there may a cell be empty (None; NaN: the file has no such column).
    Disagreement means choices coded the other way round (e.g. 0/1 swapped) or rows mixed up."""
    given = sessions["correct"].map(lambda value: isinstance(value, (bool, np.bool_))).to_numpy()
    step = sessions["step"].to_numpy()
    lower, upper = step < last_step / 2, step > (last_step + 1) / 2
    empty = sessions["correct"].map(lambda value: value is None).to_numpy() & (lower | upper)
    if empty.any():
        _refuse(sessions, _row_problems(sessions.assign(correct=sessions["correct"].fillna("")), empty, "correct",
                                        "empty 'correct' at a step that has a correct answer (only the sequence's "
                                        f"centre step, {last_step // 2}, may leave it empty)"))
    below, above = given & lower, given & upper
    expected = np.where(below, sessions["choice"] == "low", sessions["choice"] == "high")
    wrong = (below | above) & (sessions["correct"].to_numpy() != expected)
    if not wrong.any():
        return
    swapped = wrong.sum() == (below | above).sum()
    hint = ("every checked row disagrees: the choice codes are most likely the other way round (map them with "
            "--values choice:CODE=low,CODE=high)" if swapped else
            "the choices or the 'correct' values of these rows are wrong")
    _refuse(sessions, _row_problems(sessions.assign(correct=sessions["correct"].astype(object)), wrong, "correct",
                                    "'correct' disagrees with the choice at its step (below the sequence's centre "
                                    "'low' is correct, above it 'high')"), f"; {hint}")


def check_against_plan(sessions: pd.DataFrame, n_sequences: int, n_steps: int, plan_file) -> None:
    """Refuse trials of a sequence or at a step beyond the plan's (``n_sequences`` sequences of ``n_steps``
    steps each, from ``plan_file``): FileFormatError naming each such file, the column, the rows and
    the allowed range."""
    problems = (_row_problems(sessions, sessions["step"] >= n_steps, "step",
                              f"step beyond the plan's sequences (allowed steps 0..{n_steps - 1})")
                + _row_problems(sessions, sessions.get("sequence", pd.Series(0, sessions.index)) >= n_sequences,
                                "sequence",
                                f"sequence beyond the plan's {n_sequences} per site (allowed sequences "
                                f"0..{n_sequences - 1})"))
    if problems:
        _refuse(sessions, problems, f" (plan: {plan_file})")


def _row_problems(sessions: pd.DataFrame, mask, column: str, what: str) -> list[tuple[str, str]]:
    """(file, "column 'c', row(s) ...: what; e.g. value") for each file of the loaded ``sessions`` with
    rows in ``mask`` (a table made in memory, without ``file`` and ``row``: "the session table" and its
    1-based rows)."""
    bad = sessions[np.asarray(mask, dtype=bool)]
    if bad.empty:
        return []
    if "file" not in bad or "row" not in bad:
        bad = bad.assign(file="the session table", row=np.flatnonzero(np.asarray(mask, dtype=bool)) + 1)
    problems = []
    for file, rows in bad.groupby("file", sort=False):
        shown = ", ".join(str(row) for row in rows["row"].iloc[:5]) + (
            f" (+{len(rows) - 5} more)" if len(rows) > 5 else "")
        example = rows[column].iloc[0]
        example = example.item() if isinstance(example, np.generic) else example
        problems.append((file, f"column {column!r}, row(s) {shown}: {what}; e.g. {example!r}"))
    return problems


def _refuse(sessions: pd.DataFrame, problems: list[tuple[str, str]], tail: str = "") -> None:
    """One FileFormatError for problems found in loaded sessions: the file (or files, each problem then
    prefixed with its file) and every problem."""
    files = list(dict.fromkeys(file for file, _ in problems))
    listed = "; ".join(f"{f'{file}: ' if len(files) > 1 else ''}{problem}" for file, problem in problems)
    raise FileFormatError(files[0] if len(files) == 1 else ", ".join(files),
                          f"refused (nothing loaded): {listed}{tail}")


def _where(paths) -> str | Path:
    """The file an error about the sessions read together names: the file, or all of them."""
    return paths[0] if len(paths) == 1 else ", ".join(map(str, paths))


def _mapping_in_files(mapping: dict[str, str], raws, paths) -> dict[str, str]:
    """The mapping, checked against the files read together: each lab column it names must be in at
    least one of them (several files of different formats share one mapping)."""
    present = set().union(*(raw.columns for raw in raws))
    absent = sorted(set(mapping) - present)
    if absent:
        columns = "; ".join(f"{path.name}: {', '.join(map(str, raw.columns))}" for raw, path in zip(raws, paths))
        raise FileFormatError(_where(paths),
                              f"column mapping names column(s) {absent} that no file given has"
                              f"{did_you_mean(absent, present)}; their columns: {columns}")
    return mapping


def _folded(column: pd.Series) -> pd.Series:
    """A column's values as case-folded text, as messages show them."""
    return column.map(_as_text).str.casefold()


@functools.lru_cache(maxsize=4096)
def _code_key(text: str) -> str:
    """A value code or cell in the form codes are compared in: a finite number as its exact value ("1", "1.0" and "01"
    alike: "1e0"), any other text case-folded."""
    text = str(text).strip().casefold()
    try:
        number = Decimal(text) if "_" not in text else None  # Decimal reads "1_0" as 10
    except InvalidOperation:
        number = None
    if number is None or not number.is_finite():
        return text
    sign, digits, exponent = number.as_tuple()  # exact, unlike normalize(), which rounds in the decimal context
    digits = "".join(map(str, digits)).lstrip("0")
    if not digits:
        return "0"
    exponent += len(digits) - len(digits.rstrip("0"))
    return f"{'-' if sign else ''}{digits.rstrip('0')}e{exponent}"


#: The values of a ``correct`` column, as :func:`_code_key` gives them ("1.0" = "1"), and what they mean.
_TRUTH_VALUES = {_code_key(text): flag for text, flag in (("true", True), ("1", True), ("false", False), ("0", False))}


def _code_keys(column: pd.Series) -> pd.Series:
    """:func:`_code_key` of every cell of a column (each distinct value converted once)."""
    text = column.map(_as_text)
    return text.map({value: _code_key(value) for value in text.unique()})


def _holds_code(column: pd.Series, name: str, code: str) -> np.ndarray:
    """Rows of a column holding a value code: numbers compare as numbers (-1 = -1.0), other codes as text with
    case ignored; the code ``nan`` of a sham column also holds the empty and NaN cells."""
    if name in ("current_uA", "stimulated_electrode") and code == EMPTY_CELL:
        return _folded(column).isin(["", EMPTY_CELL]).to_numpy()
    if name == "current_uA":
        return (pd.to_numeric(column, errors="coerce") == float(code)).to_numpy()
    return (_code_keys(column) == _code_key(code)).to_numpy()


def _codes_in_files(values: dict[str, dict[str, str]], tables, paths) -> None:
    """Each code of the value mapping must occur in its column in at least one of the files read
    together: a code never seen is a typo or a mapping meant for other files."""
    for name, codes in values.items():
        holding = [table[name] for table in tables if name in table]
        if not holding:
            continue  # the missing column is named by each file's validation
        unseen = [code for code in codes if not any(_holds_code(column, name, code).any() for column in holding)]
        if unseen:
            found = sorted(set().union(*(set(_folded(column)) for column in holding)), key=natural_key)
            shown = ", ".join(map(repr, found[:10])) + (f" (+{len(found) - 10} more)" if len(found) > 10 else "")
            raise FileFormatError(_where(paths), f"the value mapping of column {name!r} names code(s) {unseen} that no "
                                                 f"file given holds in that column (its values: {shown}); remove "
                                                 f"them or correct the mapping")


def _renamed(raw: pd.DataFrame, mapping: dict[str, str], file_ids: dict, path: Path) -> pd.DataFrame:
    """The file's table with stimsim column names (the mapping's lab columns it has, renamed), and the
    subject and session ids of the file (NWB) where the table has no such column."""
    applied = {lab: ours for lab, ours in mapping.items() if lab in raw.columns}
    targets = list(applied.values())
    doubled = sorted({ours for ours in targets if targets.count(ours) > 1})
    if doubled:
        labs = sorted(lab for lab, ours in applied.items() if ours in doubled)
        raise FileFormatError(path, f"the column mapping maps several of the file's columns ({', '.join(labs)}) onto "
                                    f"{doubled}; a file may give each stimsim column once")
    clashing = sorted(ours for ours in applied.values() if ours in raw.columns and ours not in applied)
    if clashing:
        raise FileFormatError(path, f"the column mapping renames a column onto {clashing}, which the file already "
                                    f"has; rename or drop one of them")
    table = raw.rename(columns=applied)
    for name, value in file_ids.items():
        if value is not None and name not in table:
            table[name] = value
    return table


def _read_raw(path: Path) -> tuple[pd.DataFrame, dict]:
    """The file's trials as a DataFrame with its own column names, unvalidated, and the file-level
    ``subject_id`` and ``session_id`` (None where the format holds none), by the reader of its format."""
    if path.is_dir():
        raise ConfigError(f"session file {path} is a folder; give the session files in it (e.g. {path}/*.nwb)")
    if not path.is_file():
        raise FileNotFoundError(f"session file not found: {path}")
    table, subject_id, session_id = session_format_of(path).read(path)
    return table, {"subject_id": subject_id, "session_id": session_id}


#: The columns every session holds, whose values, trial by trial, tell one file's trials from another's.
_TRIAL_CONTENT = ("electrode", "step", "stimulated_electrode", "current_uA", "choice")
#: Optional columns that tell two files apart where both hold them (an export to another format may leave them out).
_TRIAL_DETAIL = ("start_time", "stimulus_id")


def _refuse_copies(sessions: pd.DataFrame) -> None:
    """Refuse two files that hold the same trials (a copy, or a session exported to two formats, one of which may
    lack the other's start times or image ids): their trials would be counted twice."""
    seen = {}
    for file, trials in sessions.groupby("file", sort=False):
        key = (len(trials), int(pd.util.hash_pandas_object(trials[list(_TRIAL_CONTENT)], index=False)
                                .to_numpy().dot(np.arange(1, len(trials) + 1, dtype=np.uint64))))
        for other, earlier in seen.get(key, []):
            if all(_same_where_held(trials[name], earlier[name]) for name in _TRIAL_DETAIL):
                raise FileFormatError(file, f"holds the same {len(trials)} trials, in the same order, as {other} (a "
                                            "copy, or the same session in another format?); give each session once, "
                                            "or its trials would be counted twice")
        seen.setdefault(key, []).append((file, trials))


def _same_where_held(column: pd.Series, other: pd.Series) -> bool:
    """Whether two files' values of an optional column agree row by row, or one of the files does not hold it
    (every value NaN or empty)."""
    held = [not (values.isna() | (values.map(str) == "")).all() for values in (column, other)]
    return not all(held) or column.to_numpy().tolist() == other.to_numpy().tolist()


def _validated(raw: pd.DataFrame, path: Path, known: set[str] | None,
               values: dict[str, dict[str, str]] | None = None, lab_names: dict | None = None,
               lab_codes: bool = True, electrodes_source: str = "the plan/layout") -> pd.DataFrame:
    """Check every rule on the whole file (after translating the lab's value codes, ``values``); raise
    one error listing its problems, each column named as stimsim and, where it was mapped, as the file names it
    (``lab_names``: stimsim name → the file's), or return the table. ``lab_codes``: whether the file may hold a
    lab's own codes (a session file, not a trial list stimsim wrote), which the messages then say how to map."""
    from stimsim.stimulation.electrical import MAX_CURRENT_UA

    lab_names = lab_names or {}
    present = set(raw.columns)
    unitless = [name for name in raw.columns if name in _UNITLESS_CURRENT]
    if unitless and "current_uA" not in present:
        raise FileFormatError(path, f"column {unitless[0]!r} holds a current without µA in its name; stimsim "
                                    f"reads currents only from 'current_uA' (microamperes). If the values are "
                                    f"in µA map it: --columns {unitless[0]}=current_uA; if they are in mA, "
                                    f"convert them to µA (× 1000) first")
    missing = [name for name in REQUIRED if name not in present]
    if missing:
        separated = any(mark in str(name) for name in raw.columns for mark in (";", "\t"))
        hint = did_you_mean(missing, [name for name in raw.columns if name not in COLUMNS])  # 'Choice', 'choice '
        raise FileFormatError(path, f"missing column(s) {missing}{hint}; a session table needs {list(REQUIRED)} "
                                    f"(its columns: {', '.join(map(str, raw.columns))}; map lab names with "
                                    f"--columns lab_name=stimsim_name)" + (
                                        "; the header holds ';' or tabs: a CSV table's values are separated by "
                                        "commas, with '.' as the decimal mark" if separated else ""))
    if len(raw) == 0:
        raise FileFormatError(path, "empty session: the trials table has no rows")

    problems: list[str] = []
    rows = np.arange(1, len(raw) + 1)

    def report(mask, column: str, what: str, values=None, columns: dict | None = None):
        """``values``: the example of the first bad row; ``columns`` (name → values): the first bad row's value of
        each, named (e.g. two columns that disagree)."""
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            bad = rows[mask]
            shown = ", ".join(str(r) for r in bad[:5]) + (f" (+{bad.size - 5} more)" if bad.size > 5 else "")
            example = ""
            if values is not None:
                value = values[mask][0]
                example = f"; e.g. {value.item() if isinstance(value, np.generic) else value!r}"
                if isinstance(value, str) and re.fullmatch(_DECIMAL_COMMA, value):
                    example += f" (a decimal comma: write {value.strip().replace(',', '.')})"
            if columns is not None:
                first = int(np.flatnonzero(mask)[0])
                example = "; e.g. " + ", ".join(f"{name} {np.asarray(column_values)[first]!r}"
                                                for name, column_values in columns.items())
            mapped = f" (the file's column {lab_names[column]!r})" if column in lab_names else ""
            problems.append(f"column {column!r}, row(s) {shown}: {what}{example}{mapped}")

    raw, unknown_choice = _recoded(raw, values or {}, report)
    table = pd.DataFrame({"file": str(path), "row": rows})
    for name in ("electrode", "stimulated_electrode", "choice"):
        text = raw[name].map(_as_text)
        if name != "choice":  # an id written as a float ("42.0": a CSV export of a float column) reads as '42', as
            ids = text.unique()  # the float 42.0 of an NWB column does
            text = text.map(dict(zip(ids, (re.sub(_WHOLE_FLOAT, r"\1", id_text) for id_text in ids))))
        text = text.to_numpy(dtype=object)
        hint = {"choice": " (an aborted trial has no choice: remove aborted trials from the table first)" if
                (text != "").any() else " in every row: a trial list before its session, such as a plan's "
                                        "rig/trials.nwb? give the session's file, which holds the choices",
                "stimulated_electrode": " (sham trials left empty map with --values stimulated_electrode:nan=sham)"}
        report(text == "", name, "empty value" + hint.get(name, ""))
        table[name] = text
    as_written = table["choice"].to_numpy()
    table["choice"] = table["choice"].str.lower()
    report(~table["choice"].isin(CHOICES) & ~unknown_choice & (as_written != ""), "choice",
           f"choice outside the task's options {list(CHOICES)} (a lab's own codes map with --values "
           f"choice:CODE=low,CODE=high)", as_written)
    table["stimulated_electrode"] = np.where(table["stimulated_electrode"].str.lower() == SHAM, SHAM,
                                             table["stimulated_electrode"])
    stimulated = table["stimulated_electrode"].to_numpy() != SHAM
    report(stimulated & (table["stimulated_electrode"] != table["electrode"]).to_numpy(), "stimulated_electrode",
           "stimulated electrode differs from the electrode whose sequence is shown (per-site analysis "
           "pairs a site's sequence with its own stimulation or sham" + (
               "; a lab's code for sham trials maps with --values stimulated_electrode:CODE=sham)" if lab_codes else
               ": 'sham' or the electrode's own id)"),
           columns={"stimulated_electrode": table["stimulated_electrode"], "electrode": table["electrode"]})
    condition = raw["condition"].map(_as_text).str.lower() if "condition" in raw else None
    if lab_codes and condition is not None and condition.isin([SHAM, "stimulation"]).all():
        # the rig package's column (a lab's own 'condition' may mean something else): it must agree
        says_sham = condition.to_numpy() == SHAM
        report(says_sham == stimulated, "condition", "condition disagrees with stimulated_electrode (sham trials "
               "have condition 'sham', the others another condition)",
               columns={"condition": raw["condition"].map(_as_text), "stimulated_electrode": table["stimulated_electrode"]})
    if known is not None:
        examples = ", ".join(map(repr, sorted(known, key=natural_key)[:5]))
        report(~table["electrode"].isin(known) & (table["electrode"] != ""), "electrode",
               f"electrode not in {electrodes_source} ({len(known)} known ids, e.g. {examples})",
               table["electrode"].to_numpy())

    table["step"] = _counted(raw["step"], "step", report)

    current = pd.to_numeric(raw["current_uA"], errors="coerce").to_numpy(dtype=float)
    report(~np.isfinite(current) | (current < 0), "current_uA", "current must be a number >= 0 µA (a current that "
           "marks sham trials maps with --values current_uA:CODE=sham)", raw["current_uA"].to_numpy())
    report(~stimulated & (current > 0), "current_uA", "sham trial with a current > 0 µA", current)
    report(stimulated & (current == 0), "current_uA", "stimulated trial with a current of 0 µA", current)
    # currents that cannot be µA; a trial list stimsim wrote (not lab_codes) holds its plan's current, accepted there
    report(lab_codes & stimulated & (current > 0) & (current < MIN_CURRENT_UA), "current_uA",
           f"stimulated trial with a current below {MIN_CURRENT_UA:g} µA: microstimulation currents are typically "
           "5–200 µA, so these are most likely mA; convert them to µA (× 1000) first", current)
    report(lab_codes & stimulated & (current > MAX_CURRENT_UA), "current_uA",
           f"stimulated trial with a current above {MAX_CURRENT_UA:g} µA, the highest stimsim accepts "
           "(microstimulation uses 5–200 µA, Moeller et al. 2017 300 µA), so these are most likely nA; convert them to "
           "µA (÷ 1000) first", current)
    table["current_uA"] = current
    for name, unit in PROTOCOL_COLUMNS.items():
        if name in raw:
            table[name] = pd.to_numeric(raw[name], errors="coerce").to_numpy(dtype=float)
            written = raw[name].map(_as_text)
            given = ~written.str.casefold().isin(["", EMPTY_CELL]).to_numpy()
            report(given & ~np.isfinite(table[name].to_numpy()), name,
                   f"must be a number ({unit}), or empty where a trial gives none (sham trials)", written.to_numpy())

    for name in ("start_time", "stop_time"):
        values = pd.to_numeric(raw[name], errors="coerce").to_numpy(dtype=float) if name in raw else \
            np.full(len(raw), np.nan)
        if name in raw:
            report(~np.isfinite(values), name, "time must be a number (s)", raw[name].to_numpy())
        table[name] = values
    if "start_time" in raw and "stop_time" in raw:
        report(table["stop_time"] < table["start_time"], "stop_time", "trial stops before it starts")
    if "sequence" in raw:
        table["sequence"] = _counted(raw["sequence"], "sequence", report)
    else:
        table["sequence"] = 0
    if "correct" in raw:
        correct = raw["correct"].map(_as_bool)
        blank = (raw["correct"].map(_as_text) == "").to_numpy()  # left empty: allowed at the centre step only
        report(correct.isna().to_numpy() & ~blank, "correct", "correct must be true/false (or 1/0; empty only at "
               "the sequence's centre step, which has no correct answer)", raw["correct"].to_numpy())
        table["correct"] = np.where(blank, None, correct.to_numpy(dtype=object))
    else:
        table["correct"] = np.nan
    table["stimulus_id"] = raw["stimulus_id"].map(_as_text).to_numpy(dtype=object) if "stimulus_id" in raw else ""
    if "stimulus_id" in raw:
        _check_stimulus_ids(table, "sequence" in raw, report)
    for name, default in (("subject_id", "subject"), ("session_id", path.stem)):
        ids = raw[name].map(_as_text) if name in raw else pd.Series("", index=raw.index)
        empty = (ids == "").to_numpy()
        report(empty & ~empty.all(), name, f"empty value where the other rows name a {name.removesuffix('_id')} (the "
               f"trial would count as another {name.removesuffix('_id')}'s, {default!r}: the default only of a table "
               "that names none)")
        table[name] = ids.replace("", default).to_numpy(dtype=object)
    if "start_time" in raw:
        again = (table.duplicated(["subject_id", "session_id", "start_time"]).to_numpy()
                 & np.isfinite(table["start_time"].to_numpy()))
        untimed = table.groupby(["subject_id", "session_id"])["start_time"].transform("nunique").to_numpy() == 1
        report(again & ~untimed, "start_time",
               "a trial of the same session starts at the same time as an earlier row (the trial given twice?)",
               table["start_time"].to_numpy())
        report(again & untimed, "start_time", "every trial of the session starts at the same time: the file gives no "
               "trial times; give each trial its own start time (s)", table["start_time"].to_numpy())
    if "trial" in raw and "block" in raw:  # the rig package's trial list numbers every trial of a session once
        numbered = table.assign(trial=_code_keys(raw["trial"]).to_numpy(), block=_code_keys(raw["block"]).to_numpy())
        report(numbered.duplicated(["subject_id", "session_id", "block", "trial"]).to_numpy()
               & (numbered["trial"] != "").to_numpy(), "trial",
               "a trial number of the same session and block as an earlier row (the trial given twice, or two runs "
               "of the trial list in one file without a session_id column telling them apart?)",
               raw["trial"].to_numpy())

    if problems:
        listed = problems[:_MAX_PROBLEMS_LISTED]
        more = f"; and {len(problems) - len(listed)} more problem(s)" if len(problems) > len(listed) else ""
        raise FileFormatError(path, "refused (nothing loaded): " + "; ".join(listed) + more)
    return table


def _counted(column: pd.Series, name: str, report) -> np.ndarray:
    """A column of integers >= 0 (steps, sequences) as integers; every other value reported, -1 in its place (from
    2**53 on a float holds no exact integer, and a cast of a larger one would wrap round)."""
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values != np.round(values)) | (values < 0) | (values >= 2 ** 53)
    report(bad, name, f"{name} must be an integer >= 0", column.to_numpy())
    return np.where(bad, -1, values).astype(int)


#: A number written with a decimal comma ("50,5", quoted in a CSV table), which a '.' decimal mark reads as text.
_DECIMAL_COMMA = r"\s*-?\d+,\d+\s*"

#: A whole number written as a float ("42.0", "-1.00"): its integer part is group 1.
_WHOLE_FLOAT = r"^(-?\d+)\.0+$"

#: stimsim's own image ids of the sequence task: "{electrode}_seq{j}_step{k}".
_STIMULUS_ID = r"^(?P<electrode>.+)_seq(?P<sequence>\d+)_step(?P<step>\d+)$"


def file_stem(electrode_id) -> str:
    """An electrode id as the rig's image files name it (``<stem>_seq<j>_step<k>.png``): every character other than
    letters, digits, ``.``, ``-`` and ``_`` as ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(electrode_id))


def _check_stimulus_ids(table: pd.DataFrame, has_sequence: bool, report) -> None:
    """Image ids of stimsim's form ``{electrode}_seq{j}_step{k}`` must name the row's own electrode (its id, or the
    stem of its image files, with or without the rig's ``site<n>_`` prefix: a rig may log the file's name), step
    and (when given) sequence: a disagreement means columns mapped onto the wrong names or steps counted
    another way. Ids of other forms (a lab's own) are not read."""
    named = table["stimulus_id"].str.extract(_STIMULUS_ID)
    ours = named["step"].notna().to_numpy()
    stems = table["electrode"].map(file_stem)
    own_electrode = ((named["electrode"] == table["electrode"]) | (named["electrode"] == stems)
                     | (named["electrode"].str.replace(r"^site\d+_", "", regex=True) == stems))
    report(ours & ~own_electrode.to_numpy(), "stimulus_id",
           "the image id names another electrode than column 'electrode'", table["stimulus_id"].to_numpy())
    report(ours & (pd.to_numeric(named["step"]) != table["step"]).to_numpy(), "stimulus_id",
           "the image id names another step than column 'step' (steps counted another way?)",
           table["stimulus_id"].to_numpy())
    if has_sequence:
        report(ours & (pd.to_numeric(named["sequence"]) != table["sequence"]).to_numpy(), "stimulus_id",
               "the image id names another sequence than column 'sequence'", table["stimulus_id"].to_numpy())


def _recoded(raw: pd.DataFrame, values: dict[str, dict[str, str]], report) -> tuple[pd.DataFrame, np.ndarray]:
    """The file's table with the lab's value codes translated (:data:`VALUE_TARGETS`), and the rows
    whose choice is not one of the mapped codes (reported here, with the codes allowed)."""
    raw = raw.copy()
    unknown_choice = np.zeros(len(raw), dtype=bool)
    if "choice" in values:
        codes = values["choice"]
        keys, compared = _code_keys(raw["choice"]), {_code_key(code): value for code, value in codes.items()}
        unknown_choice = ~keys.isin(compared).to_numpy() & (keys != "").to_numpy()
        report(unknown_choice, "choice", f"code not in the value mapping of 'choice' (allowed codes: "
                                         f"{', '.join(codes)})", raw["choice"].to_numpy())
        raw["choice"] = keys.map(compared).where(~unknown_choice & (keys != "").to_numpy(), raw["choice"])
    sham = np.zeros(len(raw), dtype=bool)
    for name in ("stimulated_electrode", "current_uA"):
        for code in values.get(name, ()):
            sham |= _holds_code(raw[name], name, code)
    electrodes = _code_keys(raw["electrode"]) if "stimulated_electrode" in values else None
    for code in [code for code in values.get("stimulated_electrode", ()) if code != EMPTY_CELL]:
        report((electrodes == _code_key(code)).to_numpy(), "stimulated_electrode",
               f"the sham code {code!r} is also the row's electrode id: a trial stimulating this electrode cannot be "
               "told from a sham trial (code sham trials with a value no electrode has)", raw["electrode"].to_numpy())
    if sham.any():
        raw["stimulated_electrode"] = raw["stimulated_electrode"].where(~sham, SHAM)
        if "current_uA" in values:  # a current that marks a sham trial is no current
            raw["current_uA"] = raw["current_uA"].where(~sham, 0.0)
    return raw, unknown_choice


def _as_text(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value).strip()


def _as_bool(value):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return _TRUTH_VALUES.get(_code_key(_as_text(value)))

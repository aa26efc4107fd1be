"""The kinds of file that stimsim's commands read, told apart by keys that only one kind has, so that a file given to
another command than its own is named as what it is.

>>> wrong_kind_hint({"paradigm": "categorization", "stimuli": {}}, "stimsim visualize")
' (the file looks like an experiment file: give it to `stimsim run`)'
>>> wrong_kind_hint({"paradigm": "categorization"}, "stimsim run")
''
"""
from __future__ import annotations


def _is_experiment(raw: dict) -> bool:
    return "paradigm" in raw


def _is_plan(raw: dict) -> bool:
    return "task" in raw and "array" in raw


def _is_subject(raw: dict) -> bool:
    return isinstance(raw.get("subject"), dict) and "recording" in raw


def _is_visualization(raw: dict) -> bool:
    return "inversion" in raw or ("images" in raw and "localizer" in raw)


def _is_training(raw: dict) -> bool:
    model = raw.get("model")
    return isinstance(model, dict) and ("family" in model or "base_network" in model)


#: The command that reads each kind of file: the kind in words and the test of a parsed file's keys.
FILE_KINDS = {
    "stimsim run": ("an experiment file", _is_experiment),
    "stimsim plan": ("a plan file", _is_plan),
    "stimsim subject make": ("a virtual subject file", _is_subject),
    "stimsim visualize": ("a percept visualisation file", _is_visualization),
    "stimsim train": ("a training or build file", _is_training),
}


def wrong_kind_hint(raw, command: str) -> str:
    """' (the file looks like KIND: give it to `COMMAND`)' when the parsed file ``raw`` has the keys of exactly one
    other kind than the one ``command`` (a key of :data:`FILE_KINDS`) reads and not those of its own; else ''."""
    if not isinstance(raw, dict) or FILE_KINDS[command][1](raw):
        return ""
    others = [(kind, reader) for reader, (kind, looks_like) in FILE_KINDS.items()
              if reader != command and looks_like(raw)]
    if len(others) != 1:
        return ""
    kind, reader = others[0]
    return f" (the file looks like {kind}: give it to `{reader}`)"

"""Sphinx directives that tabulate saved ``stimsim bench --out FILE.json`` reports.

The figures of a page are read from the report when the documentation is built, never typed in, so that the
page shows exactly what the benchmark measured, with the machine, the threads, the commit and the software
versions it measured them with.

Usage (MyST): ``{bench-jobs}``, a fenced block whose argument is the path (from the documentation folder) of a
``stimsim bench --sections jobs`` report, gives the jobs' table. ``{bench-values}`` tabulates any report: its
``:header:`` and each line of its content are cells separated by ``|``, every cell a Python format string over the
report's entries (``{engine_over_bound_it:.2f}``; nested entries with dots, ``{analysis.total_s:.1f}``).
"""
from __future__ import annotations

import json
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList


def _seconds(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _target(name: str, target: dict) -> str:
    verdict = {True: "met", False: "**not met**", None: "not judged"}[target["met"]]
    limit = target["limit"]
    limits = {"peak_GB": f"≤ {limit:g} GB", "wall_s_on_2_cores": f"≤ {_seconds(limit)} on 2 cores"}
    return f"{limits.get(name, f'{name} ≤ {limit}')} {verdict}"


def _table(rows: list[list[str]]) -> list[str]:
    """A Markdown table (MyST), the first row its header."""
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return lines + ["| " + " | ".join(row) + " |" for row in rows[1:]]


def jobs_table_lines(report: dict) -> list[str]:
    """Markdown of the report: a line on how it was measured, then one table row per job."""
    threads = report["jobs_threads"]
    rows = [["job: command", "wall time", "CPU time", "peak memory", "load before / after", "targets"]]
    for name, job in report["jobs"].items():
        command = job["command"].replace("|", "\\|")
        load = f"{job['load_average_1min_before']:.1f} / {job['load_average_1min_after']:.1f}"
        if job["exit_status"] != 0:
            how = (f"killed by signal {-job['exit_status']}" if job["exit_status"] < 0
                   else f"exit status {job['exit_status']}")
            rows.append([f"**{name}** (**failed**, {how}): `{command}`", "—", "—", "—", load, "not judged"])
            continue
        targets = "; ".join(_target(key, value) for key, value in job["targets"].items()) or "—"
        rows.append([f"**{name}**: `{command}`", _seconds(job["wall_s"]), _seconds(job["cpu_s"]),
                     f"{job['peak_rss_MB'] * 2**20 / 1e9:.1f} GB", load, targets])
    return [_measured(report, "`stimsim bench --sections jobs`", _at_commit(report["jobs_commit"]),
                      f"each job on {threads} thread(s)" if threads != "default" else "default threads"), "",
            *_table(rows)]


def _at_commit(commit: str | None) -> str:
    return f"at commit `{commit}`" if commit else "outside a git checkout"


def _measured(report: dict, command: str, where: str, threads: str) -> str:
    """The sentence that says how a report was measured: command, start, machine, threads, software."""
    software = report["software"]
    started = f" (started {report['started_utc']} UTC)" if "started_utc" in report else ""
    quick = "**A quick run: a smoke test of the benchmark, not its figures.** " if report["quick"] else ""
    return (f"{quick}Measured by {command}{started} {where} on {report['cpu_count']} cores ({report['cpu_model']}, load "
            f"average {report['load_average_1min_at_start']:.1f} at the start), {threads}; Python "
            f"{software['python']}, torch {software['torch']}, numpy {software['numpy']}, {report['device']}.")


class _Entries(dict):
    """A report whose entries format strings reach as fields (``{key}``) and nested ones with dots."""

    def __getattr__(self, name):
        value = self[name]
        return _Entries(value) if isinstance(value, dict) else value

    def __getitem__(self, name):
        value = dict.__getitem__(self, name)
        return _Entries(value) if isinstance(value, dict) else value


def values_table_lines(report: dict, header: str, rows: list[str]) -> list[str]:
    """Markdown: how the report was measured, then a table of the header's cells and each row's cells formatted
    with the report."""
    entries = _Entries(report)
    cells = [[cell.strip() for cell in row.split("|")] for row in [header, *(r.format_map(entries) for r in rows)]]
    return [_measured(report, "`stimsim bench`", _at_commit(report["commit"]),
                      f"{report['torch_threads']} torch thread(s)"), "", *_table(cells)]


def _report(directive: Directive) -> tuple[Path, dict]:
    source = Path(directive.state.document.settings.env.srcdir) / directive.arguments[0]
    directive.state.document.settings.env.note_dependency(str(source))
    return source, json.loads(source.read_text())


def _parsed(directive: Directive, lines: list[str], source: Path) -> list:
    container = nodes.container()
    directive.state.nested_parse(StringList(lines, str(source)), directive.content_offset, container)
    return container.children


class BenchValuesDirective(Directive):
    required_arguments = 1
    has_content = True
    option_spec = {"header": str}

    def run(self):
        source, report = _report(self)
        rows = [line for line in self.content if line.strip()]
        try:
            lines = values_table_lines(report, self.options["header"], rows)
        except KeyError as missing:
            raise self.error(f"{source}: the report has no entry {missing}; run the full `stimsim bench` again "
                             "with --out to save a report that has it") from None
        return _parsed(self, lines, source)


class BenchJobsDirective(Directive):
    required_arguments = 1

    def run(self):
        source, report = _report(self)
        try:
            lines = jobs_table_lines(report)
        except KeyError as missing:
            raise self.error(f"{source}: the report has no entry {missing}; save a report of `stimsim bench "
                             "--sections jobs --out FILE.json` there") from None
        return _parsed(self, lines, source)


def setup(app):
    app.add_directive("bench-jobs", BenchJobsDirective)
    app.add_directive("bench-values", BenchValuesDirective)
    return {"parallel_read_safe": True}

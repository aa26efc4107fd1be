"""Sphinx directive ``bench-jobs``: the table of a saved ``stimsim bench --sections jobs --out FILE.json`` report.

The figures of the page are read from the report when the documentation is built, never typed in, so that the
page shows exactly what the benchmark measured, with the machine, the threads, the commit and the software
versions it measured them with.

Usage (MyST): a fenced block ``{bench-jobs}`` whose argument is the report's path from the documentation folder.
"""
from __future__ import annotations

import json
from pathlib import Path

from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from docutils import nodes


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{seconds:.1f} s"


def _target(name: str, target: dict) -> str:
    verdict = {True: "met", False: "**not met**", None: "not judged"}[target["met"]]
    limit = {"peak_GB": f"peak ≤ {target['limit']:g} GB",
             "wall_s_on_2_cores": f"wall ≤ {_duration(target['limit'])} on 2 cores"}.get(name, f"{name} ≤ {target['limit']}")
    return f"{limit}: {verdict}"


def jobs_table_lines(report: dict) -> list[str]:
    """reStructuredText of the report: a line on how it was measured, then one table row per job."""
    software = report["software"]
    threads = report["jobs_threads"]
    started = f" (started {report['started_utc']} UTC)" if "started_utc" in report else ""
    lines = [f"Measured by ``stimsim bench --sections jobs``{started} at commit ``{report['jobs_commit']}`` on "
             f"{report['cpu_count']} cores ({report['cpu_model']}), "
             f"{'each job on ' + str(threads) + ' thread(s)' if threads != 'default' else 'default threads'}; "
             f"Python {software['python']}, torch {software['torch']}, numpy {software['numpy']}, "
             f"{report['device']}.", "",
             ".. list-table::", "   :header-rows: 1", "",
             "   * - job", "     - command", "     - wall time", "     - CPU time", "     - peak memory",
             "     - load average before / after", "     - targets"]
    for name, job in report["jobs"].items():
        status = "" if job["exit_status"] == 0 else f" (**failed**, exit status {job['exit_status']})"
        targets = "; ".join(_target(key, value) for key, value in job["targets"].items()) or "—"
        lines += [f"   * - {name}{status}", f"     - ``{job['command']}``", f"     - {_duration(job['wall_s'])}",
                  f"     - {_duration(job['cpu_s'])}", f"     - {job['peak_rss_MB'] * 2**20 / 1e9:.1f} GB",
                  f"     - {job['load_average_1min_before']:.1f} / {job['load_average_1min_after']:.1f}",
                  f"     - {targets}"]
    return lines


class BenchJobsDirective(Directive):
    required_arguments = 1

    def run(self):
        source = Path(self.state.document.settings.env.srcdir) / self.arguments[0]
        self.state.document.settings.env.note_dependency(str(source))
        report = json.loads(source.read_text())
        container = nodes.container()
        self.state.nested_parse(StringList(jobs_table_lines(report), str(source)), self.content_offset, container)
        return container.children


def setup(app):
    app.add_directive("bench-jobs", BenchJobsDirective)
    return {"parallel_read_safe": True}

"""The README's tour after a plan, as tests run it: ``stimsim subject session`` with its defaults (the plan's chosen
sites, 400 trials per site, seed 0), ``stimsim analyze --plan`` and ``stimsim power`` on the plan's directory."""
import csv
import json
from pathlib import Path

from stimsim.cli import main


def run_tour(plan_dir: Path, work_dir: Path) -> tuple[dict, dict, dict[int, dict]]:
    """The analysis's summary, power's summary and power's curve (a row per trials per site) of the tour on
    ``plan_dir``; the session and analysis are written under ``work_dir``."""
    session, analysis = work_dir / "session.nwb", work_dir / "analysis"
    assert main(["subject", "session", str(plan_dir), "--out", str(session)]) == 0
    assert main(["analyze", str(session), "--plan", str(plan_dir), "--out", str(analysis), "--no-progress"]) == 0
    assert main(["power", str(plan_dir), "--no-progress"]) == 0
    with open(plan_dir / "power" / "power_curve.csv", newline="") as handle:
        curve = {int(row["trials_per_site"]): row for row in csv.DictReader(handle)}
    return (json.loads((analysis / "summary.json").read_text()),
            json.loads((plan_dir / "power" / "summary.json").read_text()), curve)

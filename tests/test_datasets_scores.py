"""Published datasets as benchmarks: each dataset's score, ceiling and chance (stimsim.datasets), and
`stimsim models score` (stimsim.paradigms.scoring) on the small shipped model."""
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from stimsim.cli import main
from stimsim.datasets import afraz2006, get_dataset, moeller2017
from stimsim.paradigms.scoring import benchmark_experiments
from stimsim.utilities.io import read_result_set

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
SCORE_KEYS = {"metric", "description", "score", "score_ci", "ceiling", "ceiling_ci", "chance", "normalized",
              "undefined_reason"}


def _prefix(group):
    return "" if group == "face" else f"{group}_"


# --- Moeller et al. 2017: hit-drop agreement ------------------------------------------------------
@pytest.fixture
def moeller_table(shared_data):
    """The published cells counted by hand from the CSV: (location, group, trial) → (hits off, trials off,
    hits on, trials on), monkeys pooled; only cells with trials with and without stimulation."""
    table = pd.read_csv(shared_data("moeller2017/summary_hits_misses.csv"))
    cells = {}
    for location, where in (("inside", "within_facepatch"), ("outside", "outside_facepatch")):
        for group, klass in (("face", "Faces"), ("object", "Objects")):
            rows = table[(table["Perturbation_Location"] == where) & (table["Stimulus_Class"] == klass)]
            for trial, column in (("same", "Same"), ("different", "Different")):
                off = rows[f"Hit_{column}"].sum(), rows[f"Hit_{column}"].sum() + rows[f"Miss_{column}"].sum()
                on = (rows[f"Hit_{column}_MSC"].sum(),
                      rows[f"Hit_{column}_MSC"].sum() + rows[f"Miss_{column}_MSC"].sum())
                if off[1] > 0 and on[1] > 0:
                    cells[(location, group, trial)] = (off[0], off[1], on[0], on[1])
    return cells


def _data_drops(cells):
    return {cell: h_off / n_off - h_on / n_on for cell, (h_off, n_off, h_on, n_on) in cells.items()}


def _model_summary(drops):
    return {f"model_{_prefix(group)}{trial}_hit_drop_{location}": drop for (location, group, trial), drop in drops.items()}


def test_moeller_score_chance_and_ceiling_match_the_published_counts(moeller_table):
    data, summary = moeller2017.compare(["face", "object"], _prefix)
    cells = moeller_table
    assert len(cells) == 6  # objects outside the face patches have no trials
    drops = _data_drops(cells)
    # a model with a drop of 0.5 everywhere, counted by hand
    values = moeller2017.score({**summary, **_model_summary({cell: 0.5 for cell in cells})}, data, _prefix, seed=0)
    assert values["score"] == pytest.approx(1 - np.mean([abs(0.5 - d) for d in drops.values()]), abs=1e-12)
    assert values["chance"] == pytest.approx(1 - np.mean([abs(d) for d in drops.values()]), abs=1e-12)
    # the ceiling: the expected agreement of a binomial replicate of the table with it, computed exactly
    expected = []
    for (h_off, n_off, h_on, n_on), drop in zip(cells.values(), drops.values()):
        p_off = binom.pmf(np.arange(n_off + 1), n_off, h_off / n_off)
        p_on = binom.pmf(np.arange(n_on + 1), n_on, h_on / n_on)
        deviation = np.abs(np.arange(n_off + 1)[:, None] / n_off - np.arange(n_on + 1)[None, :] / n_on - drop)
        expected.append(p_off @ deviation @ p_on)
    exact = 1 - np.mean(expected)
    assert values["ceiling"] == pytest.approx(exact, abs=2e-3)  # 1,000 replicates: standard error ~3e-4
    low, high = values["ceiling_ci"]
    assert low < exact < high < 1
    assert values["chance"] < values["ceiling"] < 1


def test_moeller_ceiling_is_seeded(moeller_table):
    data, summary = moeller2017.compare(["face", "object"], _prefix)
    model = {**summary, **_model_summary({cell: 0.2 for cell in moeller_table})}
    first, again = (moeller2017.score(model, data, _prefix, seed=3) for _ in range(2))
    other = moeller2017.score(model, data, _prefix, seed=4)
    assert first["ceiling"] == again["ceiling"] and list(first["ceiling_ci"]) == list(again["ceiling_ci"])
    assert other["ceiling"] != first["ceiling"]
    assert other["score"] == first["score"]  # the score itself draws nothing


def test_moeller_model_equal_to_the_data_scores_one_and_the_chance_model_zero(moeller_table):
    data, summary = moeller2017.compare(["face", "object"], _prefix)
    dataset = get_dataset("moeller2017")
    trials = type("Trials", (), {"summary_prefix": staticmethod(_prefix)})()
    task = type("Task", (), {"seed": 0, "analysis": type("Analysis", (), {"ci": 0.95})()})()
    equal = dataset.score(task, trials, {**summary, **_model_summary(_data_drops(moeller_table))}, data)
    assert set(equal) == SCORE_KEYS and equal["metric"] == "hit-drop agreement"
    assert equal["score"] == pytest.approx(1.0, abs=1e-12)
    # above its ceiling, reported as it is
    assert equal["normalized"] == pytest.approx((1 - equal["chance"]) / (equal["ceiling"] - equal["chance"]))
    assert equal["normalized"] > 1 and equal["undefined_reason"] is None
    unchanged = dataset.score(task, trials, {**summary, **_model_summary({cell: 0.0 for cell in moeller_table})}, data)
    assert unchanged["score"] == pytest.approx(unchanged["chance"], abs=1e-12)
    assert unchanged["normalized"] == pytest.approx(0.0, abs=1e-12)


def test_moeller_undefined_scores_say_why(moeller_table):
    data, summary = moeller2017.compare(["face", "object"], _prefix)
    dataset = get_dataset("moeller2017")
    model = _model_summary({cell: 0.1 for cell in moeller_table})
    model["model_object_different_hit_drop_inside"] = None
    model["model_same_hit_drop_outside"] = float("nan")
    values = moeller2017.score({**summary, **model}, data, _prefix, seed=0)
    record = dataset.score_record(**values)
    assert record["score"] is None and record["normalized"] is None and record["ceiling"] is not None
    assert "model_object_different_hit_drop_inside" in record["undefined_reason"]
    assert "model_same_hit_drop_outside" in record["undefined_reason"]
    skipped = dataset.score_record(**moeller2017.score({"comparison_skipped": "no mirror"}, None, _prefix, seed=0))
    assert skipped["score"] is skipped["ceiling"] is skipped["normalized"] is None
    assert "not available" in skipped["undefined_reason"] and "no mirror" in skipped["undefined_reason"]


# --- Afraz et al. 2006: shift-selectivity correlation -----------------------------------------------
def test_afraz_score_is_the_model_r_over_the_monkeys_r(shared_data):
    shared_data("afraz2006")
    _, data_summary = afraz2006.compare(n_perm=20, n_boot=50, ci=0.95, seed=0)
    dataset = get_dataset("afraz2006")
    for model_r in (0.25, 0.8):
        record = dataset.score(None, None, {"model_r": model_r, "model_r_ci": [model_r - 0.1, model_r + 0.1],
                                            **data_summary}, None)
        assert set(record) == SCORE_KEYS and record["metric"] == "shift-selectivity correlation"
        assert record["score"] == model_r and record["chance"] == 0.0
        assert record["ceiling"] == data_summary["data_r"] == pytest.approx(0.552, abs=1e-3)
        assert record["ceiling_ci"] == data_summary["data_r_ci"]
        assert record["normalized"] == pytest.approx(model_r / data_summary["data_r"], abs=1e-12)
    assert record["normalized"] > 1  # r 0.8 lies above the monkeys' 0.55: not clipped
    undefined = dataset.score(None, None, {"model_r": None, "model_n_sites": 2, **data_summary}, None)
    assert undefined["score"] is None and undefined["normalized"] is None
    assert undefined["ceiling"] == data_summary["data_r"]
    assert "model_r is undefined" in undefined["undefined_reason"] and "2 usable sites" in undefined["undefined_reason"]
    skipped = dataset.score(None, None, {"model_r": 0.3, "comparison_skipped": "no mirror here"}, None)
    assert skipped["score"] == 0.3 and skipped["ceiling"] is None and skipped["normalized"] is None
    assert "data_r is unavailable" in skipped["undefined_reason"] and "no mirror here" in skipped["undefined_reason"]


def test_a_ceiling_equal_to_chance_leaves_normalized_undefined():
    record = get_dataset("afraz2006").score(None, None, {"model_r": 0.3, "data_r": 0.0}, None)
    assert record["score"] == 0.3 and record["normalized"] is None
    assert "ceiling equals chance" in record["undefined_reason"]


# --- stimsim models score -------------------------------------------------------------------------
def test_the_scores_table_holds_the_score_and_ceiling_intervals_of_scores_json():
    """scores.csv gives each interval of scores.json's ``score`` as two columns (the metrics have no unit); a score
    without an interval (Moeller's) has NaN there."""
    from stimsim.paradigms.scoring import PRINTED_COLUMNS, TABLE_COLUMNS, score_table

    afraz = get_dataset("afraz2006").score(None, None, {"model_r": 0.31, "model_r_ci": [0.05, 0.52], "data_r": 0.43,
                                                        "data_r_ci": [0.25, 0.58]}, None)
    moeller = get_dataset("moeller2017").score_record(0.9, 0.97, 0.81, ceiling_ci=[0.93, 0.99])
    table = score_table({"experiments": [{"experiment": name, "dataset": name, "score": record, "run_dir": name}
                                         for name, record in (("afraz2006", afraz), ("moeller2017", moeller))]})
    assert list(table.columns) == list(TABLE_COLUMNS) and PRINTED_COLUMNS == TABLE_COLUMNS[:7]
    assert table.loc[0, ["score_ci_low", "score_ci_high", "ceiling_ci_low", "ceiling_ci_high"]].tolist() == [
        0.05, 0.52, 0.25, 0.58]
    assert table.loc[1, ["score_ci_low", "score_ci_high"]].isna().all()
    assert table.loc[1, ["ceiling_ci_low", "ceiling_ci_high"]].tolist() == [0.93, 0.99]


def _small_afraz(path: Path) -> Path:
    """experiments/afraz2006.toml on the images the 32-px models hold out (LFW faces against LFW backgrounds and
    Fashion-MNIST), with 4 + 4 sites, 10 images per choice and 20 resamples."""
    text = (EXPERIMENTS / "afraz2006.toml").read_text()
    stimuli = ('[stimuli]\nsets = [{ source = "lfw_subset", heldout_only = true }, '
               '{ source = "fashion_mnist", split = "test", n_per_class = 3, seed = 0 }]\n'
               'label = "category"\npositive = "face"\nnegative = "nonface"\nn_per_choice = 10\n\n[stimuli.noise]')
    text = re.sub(r"\[stimuli\].*?\[stimuli\.noise\]", stimuli, text, flags=re.S)
    for key, value in (("n_selective", 4), ("n_other", 4), ("n_boot", 20), ("n_perm", 20)):
        text = re.sub(rf"{key} = \d+", f"{key} = {value}", text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _store_files(run_dir: Path) -> dict:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run_dir / "simulation_store").iterdir()}


def test_models_score_on_the_small_model_writes_the_table_and_resumes(tmp_path, capsys, shared_data,
                                                                      one_torch_thread):
    shared_data("afraz2006")
    experiment = _small_afraz(tmp_path / "experiments" / "afraz2006.toml")
    out = tmp_path / "scores"
    argv = ["models", "score", "stimsim-topo-s0", str(experiment), "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    run_dir = out / "afraz2006"
    summary = json.loads((run_dir / "summary.json").read_text())
    scores = json.loads((out / "scores.json").read_text())
    assert scores["model"] == "stimsim-topo-s0" and len(scores["experiments"]) == 1
    entry = scores["experiments"][0]
    assert (entry["experiment"], entry["dataset"], entry["run_dir"]) == ("afraz2006", "afraz2006", "afraz2006")
    assert entry["citation"].startswith("Afraz")
    assert entry["score"] == summary["score"]
    assert entry["score"]["score"] == summary["model_r"] and entry["score"]["ceiling"] == summary["data_r"]
    assert entry["score"]["normalized"] == pytest.approx(summary["model_r"] / summary["data_r"])
    assert entry["effects"]["model_mean_shift_selective"] == summary["model_mean_shift_selective"]
    table = pd.read_csv(out / "scores.csv")
    assert table.loc[0, "metric"] == "shift-selectivity correlation"
    assert table.loc[0, "normalized"] == pytest.approx(entry["score"]["normalized"], rel=1e-5)
    for key in ("score_ci", "ceiling_ci"):
        assert table.loc[0, [f"{key}_low", f"{key}_high"]].tolist() == pytest.approx(entry["score"][key], rel=1e-5)
    assert re.search(rf"afraz2006\s+afraz2006\s+shift-selectivity correlation\s+{summary['model_r']:.3f}\s+"
                     rf"{summary['data_r']:.3f}\s+0\.000\s+{entry['score']['normalized']:.3f}", printed)
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["name"] == "stimsim-topo-s0" and "weights_sha256" in config["model"]
    assert config["experiments"][0]["experiment_file"] == str(experiment) and "software" in config
    # the same command again reuses the finished simulation (its store's chunks are not rewritten)
    store = _store_files(run_dir)
    assert store and main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == scores
    assert _store_files(run_dir) == store
    # another selection of experiments into the same folder: the earlier run stays, the table lists this one's
    other = experiment.with_name("afraz_b.toml")
    other.write_text(experiment.read_text())
    assert main(["models", "score", "stimsim-topo-s0", str(other), "--out", str(out), "--no-progress"]) == 0
    assert [e["run_dir"] for e in json.loads((out / "scores.json").read_text())["experiments"]] == ["afraz_b"]
    assert (run_dir / "summary.json").is_file() and pd.read_csv(out / "scores.csv")["run_dir"].tolist() == ["afraz_b"]


def test_models_score_run_again_and_stopped_while_writing_keeps_the_earlier_table(tmp_path, shared_data,
                                                                                  one_torch_thread, stop_at_a_table):
    """Scores run again into their --out and stopped (Ctrl-C, or killed) while they write the table leave the earlier
    scores whole and readable, during the run and after it."""
    from stimsim.paradigms import scoring

    shared_data("afraz2006")
    out = tmp_path / "scores"
    argv = ["models", "score", "stimsim-topo-s0", str(_small_afraz(tmp_path / "experiments" / "afraz2006.toml")),
            "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    earlier = {name: path.read_bytes() for name, path in read_result_set(out).items()}
    seen = stop_at_a_table(out, scoring)
    assert main(argv) == 130
    assert seen == [earlier]
    assert {name: path.read_bytes() for name, path in read_result_set(out).items()} == earlier


def test_models_score_refuses_bad_input_and_leaves_no_directory(tmp_path, capsys, monkeypatch):
    out = tmp_path / "scores"
    monkeypatch.chdir(tmp_path)  # no experiments/ here
    assert main(["models", "score", "stimsim-topo-s0", "--out", str(out), "--no-progress"]) == 2
    assert "no experiment to score" in capsys.readouterr().err
    plain = tmp_path / "plain.toml"
    plain.write_text(re.sub(r"\[comparison\][^\[]*", "", (EXPERIMENTS / "afraz2006.toml").read_text()))
    assert main(["models", "score", "stimsim-topo-s0", str(plain), "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("stimsim: error: ") and error.count("\n") == 1
    assert "plain.toml" in error and "no [comparison]" in error
    assert main(["models", "score", "no-such-model", str(EXPERIMENTS / "afraz2006.toml"), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "unknown model 'no-such-model'" in error and error.count("\n") == 1
    assert main(["models", "score", "no-such-model", "--out", str(out)]) == 2  # no experiments here either
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    twin = tmp_path / "other" / "afraz2006.toml"
    twin.parent.mkdir()
    twin.write_text((EXPERIMENTS / "afraz2006.toml").read_text())
    assert main(["models", "score", "stimsim-topo-s0", str(EXPERIMENTS / "afraz2006.toml"), str(twin),
                 "--out", str(out)]) == 2
    assert "both run into afraz2006/" in capsys.readouterr().err
    assert not out.exists()


def test_default_experiments_are_those_compared_with_a_registered_dataset(tmp_path):
    assert [p.name for p in benchmark_experiments(REPO)] == ["afraz2006.toml", "moeller2017.toml"]
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "plan.toml").write_text((EXPERIMENTS / "plan_default.toml").read_text())
    assert benchmark_experiments(tmp_path) == []
    other = re.sub(r'dataset = "afraz2006"', 'dataset = "unregistered"', (EXPERIMENTS / "afraz2006.toml").read_text())
    (tmp_path / "experiments" / "other.toml").write_text(other)
    assert benchmark_experiments(tmp_path) == []


def test_the_moeller_ceiling_and_chance_the_documentation_quotes(moeller_table):
    docs = (REPO / "docs" / "experiments.md").read_text(encoding="utf-8")
    quoted = re.search(r"the Moeller ceiling is ([\d.]+) \(95 % of replicates within ([\d.]+)–([\d.]+)\) and chance "
                       r"([\d.]+)", docs)
    ceiling, low, high, chance = map(float, quoted.groups())
    fewest, most = map(int, re.search(r"outside-patch cells \((\d+)–(\d+) stimulated trials\)", docs).groups())
    assert sorted(n_on for (location, _, _), (_, _, _, n_on) in moeller_table.items()
                  if location == "outside") == [fewest, most]
    data, summary = moeller2017.compare(["face", "object"], _prefix)
    values = moeller2017.score(summary, data, _prefix, seed=0, ci=0.95)
    assert values["ceiling"] == pytest.approx(ceiling, abs=5e-4) and values["chance"] == pytest.approx(chance, abs=5e-4)
    assert list(values["ceiling_ci"]) == pytest.approx([low, high], abs=5e-4)

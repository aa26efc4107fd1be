"""The 2AFC sequence task as a paradigm (``paradigm = "sequence_2afc"``): registered, its experiment files
validated, a run end to end, and its numbers against the planning rehearsal of the same task and against
hand computations from the stored choice probabilities."""
import dataclasses
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from stimsim.data.stimuli import load_stimulus_source
from stimsim.paradigms import PARADIGMS, get_paradigm, load_experiment, parse_experiment
from stimsim.paradigms.runner import load_results, run_experiment
from stimsim.paradigms.schema import SCHEMA_PATH
from stimsim.paradigms.sequence_2afc import TaskSpec, fit_readouts
from stimsim.paradigms.sites import CONTROL_LABEL, Site, SiteSelection
from stimsim.planning.tasks.sequence_2afc import rehearse
from stimsim.sequences import SequenceSpec, build_sequences, pooling_matrix
from stimsim.stimulation import Condition
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SITES_MM = [[3.0, 3.0], [6.5, 6.0], [2.5, 7.5]]

TINY = f"""
name = "tiny_sequences"
paradigm = "sequence_2afc"
model = "stimsim-topo-s0"
seed = 4
[stimuli]
sets = [{{ source = "lfw_subset" }}]
[sequences]
n_sequences = 2
iterations = 10
learning_rate = 0.05
[decoder]
n_noise = 6
n_eval = 4
[sites]
method = "explicit"
sites_mm = {SITES_MM}
recording_radius_mm = 0.5
[sites.localizer]
label = "category"
positive = "face"
[stimulation]
kind = "electrical"
current_uA = 50
frequency_Hz = 200
pulse_width_ms = 0.2
interphase_ms = 0.1
train_ms = 50
[analysis]
n_boot = 50
"""
STIMULATION = {"current_uA": 50.0, "frequency_Hz": 200.0, "pulse_width_ms": 0.2, "interphase_ms": 0.1,
               "train_ms": 50.0}


def _spec():
    return parse_experiment(tomllib.loads(TINY), where="tiny.toml")


# --- registry and experiment files ---------------------------------------------------------------------
def test_registered_listed_and_in_the_shipped_schema():
    assert "sequence_2afc" in PARADIGMS.names()
    assert get_paradigm("sequence_2afc").comparisons() == []
    shipped = json.loads(SCHEMA_PATH.read_text())
    assert "sequence_2afc_experiment" in {alternative["$ref"].rsplit("/", 1)[-1] for alternative in shipped["oneOf"]}


def test_shipped_experiment_file_parses_with_the_plans_task_keys():
    spec = load_experiment(EXPERIMENTS / "sequence2afc.toml")
    assert spec.paradigm == "sequence_2afc" and spec.sites.method == "selectivity"
    assert spec.options.task == TaskSpec(n_noise=24, n_eval=8, noise_sd=0.15, C=1e-3)
    sequences = spec.options.sequence_spec(spec.sites.recording_radius_mm)
    assert (sequences.n_sequences, sequences.n_steps, sequences.max_sd, sequences.recording_radius_mm) == (3, 7, 5.0, 0.5)
    # 50 µA × 0.2 ms on a 2000 µm² tip: k = log10(500) + log10(0.01) = 0.699
    assert spec.safety["passed"] and spec.safety["shannon_k"] == pytest.approx(0.69897, abs=1e-4)


def test_tables_are_optional_with_the_plans_defaults():
    raw = tomllib.loads(TINY)
    del raw["sequences"], raw["decoder"]
    spec = parse_experiment(raw, where="tiny.toml")
    assert spec.options.task == TaskSpec()
    assert spec.options.sequence_spec(0.5) == SequenceSpec(recording_radius_mm=0.5)


@pytest.mark.parametrize("table, key, value, message", [
    ("sequences", "n_steps", 6, r"tiny.toml \[sequences\]: 'n_steps' must be odd"),
    ("sequences", "n_sequences", 0, r"tiny.toml \[sequences\]: 'n_sequences' must be >= 1, got 0"),
    ("sequences", "max_sd", -1.0, r"\[sequences\]: 'max_sd' must be > 0"),
    ("sequences", "n_sequencs", 3, r"\[sequences\]: unknown key 'n_sequencs'"),
    ("sequences", "recording_radius_mm", 0.25, r"\[sequences\]: 'recording_radius_mm' is not set here: .*\[sites\]"),
    ("sequences", "ensemble", True, r"\[sequences\]: 'ensemble' is not set here"),
    ("decoder", "n_eval", 1, r"tiny.toml \[decoder\]: 'n_eval' must be >= 2, got 1"),
    ("decoder", "noise_sd", 0.0, r"\[decoder\]: 'noise_sd' must be > 0"),
    ("decoder", "n_noise", 2.5, r"\[decoder\]: 'n_noise' must be an integer"),
    ("decoder", "fit_fraction", 0.5, r"\[decoder\]: 'fit_fraction' does not apply to sequence_2afc"),
])
def test_bad_values_name_the_table_and_key(table, key, value, message):
    raw = tomllib.loads(TINY)
    raw[table][key] = value
    with pytest.raises(ConfigError, match=message):
        parse_experiment(raw, where="tiny.toml")


def test_the_decoder_keys_belong_to_this_paradigm_only():
    raw = load_toml(EXPERIMENTS / "afraz2006.toml")
    raw["decoder"]["n_noise"] = 24
    with pytest.raises(ConfigError, match=r"afraz2006.toml \[decoder\]: unknown key 'n_noise'"):
        parse_experiment(raw, where="afraz2006.toml")


# --- the task in a model -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(one_torch_thread):
    from stimsim.models.registry import load_model

    return load_model("stimsim-topo-s0")


@pytest.fixture(scope="module")
def prepared(model):
    """The tiny experiment's trials on the model's own sheet (sites given by hand)."""
    spec = _spec()
    sites = tuple(Site(f"site_{i:03d}", x, y, "explicit", np.nan, 0) for i, (x, y) in enumerate(SITES_MM))
    selection = SiteSelection(sites=sites, method="explicit", unit_dprime=np.zeros(model.sheet("IT").n_units),
                              peak_mm=(0.0, 0.0), recording_radius_mm=0.5, smoothing_sigma_mm=0.5)
    stimuli = load_stimulus_source({"source": "lfw_subset"})
    trials = get_paradigm(spec.paradigm).prepare(spec.settings(), model, stimuli, selection)
    return spec, selection, stimuli, trials


@pytest.mark.parametrize("table, key", [("decoder", "n_eval"), ("decoder", "n_noise"), ("sequences", "n_steps")])
def test_counts_whose_images_cannot_fit_in_memory_are_refused_before_any_work(model, monkeypatch, table, key):
    # 10**9 + 1 (odd, for n_steps) noisy copies or steps of 32 px images: over 4 TB at 4 bytes a pixel
    raw = tomllib.loads(TINY)
    raw[table][key] = 10**9 + 1
    spec = parse_experiment(raw, where="tiny.toml")
    sites = tuple(Site(f"site_{i:03d}", x, y, "explicit", np.nan, 0) for i, (x, y) in enumerate(SITES_MM))
    selection = SiteSelection(sites=sites, method="explicit", unit_dprime=np.zeros(model.sheet("IT").n_units),
                              peak_mm=(0.0, 0.0), recording_radius_mm=0.5, smoothing_sigma_mm=0.5)
    monkeypatch.setattr("stimsim.paradigms.sequence_2afc.build_sequences",
                        lambda *args, **kwargs: pytest.fail("the sequences were built"))
    with pytest.raises(ConfigError, match=rf"^tiny.toml: holding the 2AFC images .* needs about .* TiB of memory, "
                                          rf"more than .*; lower .*{key}"):
        get_paradigm(spec.paradigm).prepare(spec.settings(), model, load_stimulus_source({"source": "lfw_subset"}),
                                            selection)


def _conditions(spec, selection, **changes):
    template = dataclasses.replace(spec.perturbation, **changes)
    return [Condition(CONTROL_LABEL)] + [
        Condition(site.label, (dataclasses.replace(template, sites_mm=(site.position_mm,)),))
        for site in selection.sites]


@pytest.fixture(scope="module")
def simulated(model, prepared):
    """Every site's trials under the control condition and stimulation at every site, and their analysis."""
    spec, selection, _, trials = prepared
    probabilities = get_paradigm(spec.paradigm).simulate(spec.settings(), model, trials, _conditions(spec, selection),
                                                          None, False)
    metrics, summary = get_paradigm(spec.paradigm).analyse(spec.settings(), trials, probabilities, selection)
    return probabilities, metrics, summary


def test_own_site_delta_auc_equals_the_planning_rehearsal(model, prepared, simulated):
    """The paradigm and the plan's rehearsal (sequences, readouts and sweeps computed along the planning
    path) give the same ΔAUC for the same model, sites, images and seed."""
    spec, selection, stimuli, trials = prepared
    _, metrics, summary = simulated
    sites = np.array(SITES_MM, dtype=np.float64)
    sequences = build_sequences(model, sites, stimuli.images, SequenceSpec(n_sequences=2, iterations=10,
                                learning_rate=0.05, recording_radius_mm=0.5), layer="IT", seed=4, progress=False)
    np.testing.assert_array_equal(trials.sequences.images, sequences.images)
    task = TaskSpec(n_noise=6, n_eval=4)
    readouts, noise_sd = fit_readouts(model, sequences.images, pooling_matrix(model.sheet("IT"), sites, 0.5), task,
                                      seed=4, progress=False)
    planned = rehearse(model, sequences.images, sites[:, None, :], STIMULATION, readouts, task,
                       sequences.site_response, noise_sd, seed=4, progress=False)
    np.testing.assert_allclose(metrics["own_delta_auc_per_sequence"].values, planned.delta_auc[:, 0], rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(metrics["slope_to_noise"].values, planned.slope_to_noise, rtol=0, atol=1e-12)
    p_high = metrics["p_high"].values  # (control + stimulated sites, sequence site, sequence, step)
    for s in range(3):  # control and stimulated P(high) curves of each site's own sequences
        np.testing.assert_allclose(p_high[0, s], planned.p_high[s, 0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(p_high[1 + s, s], planned.p_high[s, 1], rtol=0, atol=1e-12)
    assert summary["own_delta_auc"] == pytest.approx(
        {f"site_{s:03d}": planned.delta_auc[s, 0].mean() for s in range(3)}, abs=1e-12)


def test_a_condition_without_effect_has_delta_auc_exactly_zero(model, prepared):
    """0 Hz in the multiplicative form leaves every unit's activity as it is: P(high) is the control's."""
    spec, selection, _, trials = prepared
    paradigm = get_paradigm(spec.paradigm)
    probabilities = paradigm.simulate(spec.settings(), model, trials, _conditions(spec, selection, frequency_Hz=0.0),
                                      None, False)
    metrics, summary = paradigm.analyse(spec.settings(), trials, probabilities, selection)
    assert np.all(metrics["delta_auc"].values == 0.0)
    assert summary["mean_own_delta_auc"] == 0.0 and summary["mean_cross_abs_delta_auc"] == 0.0
    assert summary["delta_auc_chance"] == 0.0


def test_the_readouts_follow_the_sequences_without_stimulation(prepared, simulated):
    """P(high) of single noisy step images orders the high half of each sequence above the low half
    (Mann–Whitney AUC, counted here pair by pair; chance 0.5)."""
    _, selection, _, _ = prepared
    probabilities, metrics, _ = simulated
    p = probabilities.sel(condition=CONTROL_LABEL, choice="high")
    for site in selection.sites:
        mine = p.where(p["stimulus_site"] == site.label, drop=True)
        low = mine.where(mine["stimulus_step"] < 3, drop=True).values
        high = mine.where(mine["stimulus_step"] > 3, drop=True).values
        pairs = high[:, None] - low[None, :]
        by_hand = np.mean(pairs > 0) + 0.5 * np.mean(pairs == 0)
        assert float(metrics["control_step_auc"].sel(sequence_site=site.label)) == pytest.approx(by_hand, abs=1e-12)
        assert by_hand > 0.75, site.label
    # the mean P(high) rises from the low end to the high end of every sequence
    curves = metrics["p_high"].sel(condition=CONTROL_LABEL).values
    assert np.all(curves[..., -1] > curves[..., 0] + 0.3)


# --- end to end ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory, one_torch_thread):
    out = tmp_path_factory.mktemp("sequence_run")
    path = out.parent / "tiny_sequences.toml"
    path.write_text(TINY)
    summary = run_experiment(path, out, progress=False)
    return out, summary


def test_run_writes_per_site_metrics_and_figures(run):
    out, summary = run
    dataset, stored, config = load_results(out)
    assert stored["paradigm"] == "sequence_2afc" and stored["n_sites"] == 3 and summary["n_sites"] == 3
    labels = [f"site_{i:03d}" for i in range(3)]
    assert sorted(stored["own_delta_auc"]) == labels and sorted(stored["cross_abs_delta_auc"]) == labels
    for key in ("mean_own_delta_auc", "mean_cross_delta_auc", "mean_own_abs_delta_auc", "mean_cross_abs_delta_auc",
                "mean_locality_abs_delta_auc", "control_step_auc_mean"):
        assert np.isfinite(stored[key]), key
    assert stored["delta_auc_chance"] == 0.0 and stored["control_step_auc_chance"] == 0.5
    assert dataset["choice_probability"].shape == (4, 3 * 2 * 7 * 4, 2)
    assert dataset["delta_auc"].dims == ("site", "sequence_site", "sequence")
    assert dataset["sequence_image"].shape == (3, 2, 7, 32, 32)
    assert config["trials"]["n_test_images"] == 168 and config["trials"]["task"]["n_eval"] == 4
    decoder = json.loads((out / "decoder.json").read_text())
    assert decoder["kind"] == "sequence_readouts" and len(decoder["weight"]) == 3 * 2
    for figure in ("sites.png", "delta_auc_matrix.png", "p_high_steps.png", "sequences.png"):
        assert (out / figure).stat().st_size > 1000, figure


def test_stored_delta_auc_and_locality_recomputed_from_the_choice_probabilities(run):
    """ΔAUC by hand: mean P(high) over the noisy copies, trapezoid over steps scaled to [0, 1], stimulated
    minus control; locality: mean |ΔAUC| on the site's own sequences minus on the other sites'."""
    dataset, summary, _ = load_results(run[0])
    p = dataset["choice_probability"].sel(choice="high")
    labels = [str(v) for v in dataset["site"].values]
    x = np.linspace(0, 1, 7)
    effect = np.empty((3, 3, 2))
    for t, sequences_of in enumerate(labels):
        mine = p.where(p["stimulus_site"] == sequences_of, drop=True)
        curves = {}
        for condition in [CONTROL_LABEL] + labels:
            values = mine.sel(condition=condition)
            curve = np.zeros((2, 7))
            for j in range(2):
                for k in range(7):
                    chosen = (values["stimulus_sequence"] == j) & (values["stimulus_step"] == k)
                    curve[j, k] = float(values.where(chosen, drop=True).mean())
            curves[condition] = curve
        for s, stimulated in enumerate(labels):
            effect[s, t] = np.trapezoid(curves[stimulated], x, axis=-1) - np.trapezoid(curves[CONTROL_LABEL], x, axis=-1)
    np.testing.assert_allclose(dataset["delta_auc"].values, effect, rtol=0, atol=1e-12)
    own = np.abs(effect[np.arange(3), np.arange(3)]).mean(-1)
    cross = np.array([np.abs(np.delete(effect[s], s, axis=0)).mean() for s in range(3)])
    assert summary["mean_own_abs_delta_auc"] == pytest.approx(own.mean(), abs=1e-12)
    assert summary["mean_cross_abs_delta_auc"] == pytest.approx(cross.mean(), abs=1e-12)
    assert summary["mean_locality_abs_delta_auc"] == pytest.approx((own - cross).mean(), abs=1e-12)
    assert summary["own_delta_auc"]["site_001"] == pytest.approx(effect[1, 1].mean(), abs=1e-12)


def test_sequence_design_shows_the_step_placement_on_stderr_only_when_asked(model, prepared, capsys):
    """The step placement (a pass over every image on the lines to the ends: minutes at 224 px) has a bar of
    its own for each end, and none with ``progress=False``."""
    _, _, stimuli, _ = prepared
    spec = SequenceSpec(n_sequences=1, n_steps=3, iterations=1, recording_radius_mm=0.5)
    build_sequences(model, np.array(SITES_MM[:1], dtype=np.float64), stimuli.images, spec, layer="IT", progress=True)
    shown = capsys.readouterr().err
    assert "placing steps towards the low ends" in shown and "placing steps towards the high ends" in shown
    build_sequences(model, np.array(SITES_MM[:1], dtype=np.float64), stimuli.images, spec, layer="IT", progress=False)
    assert "placing steps" not in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.every_model
@pytest.mark.timeout(1800)
def test_the_shipped_file_on_the_default_model_gives_the_table_of_the_docs(shared_data, base_network, tmp_path):
    """``stimsim run experiments/sequence2afc.toml`` on one thread (deterministic there): every figure of
    docs/experiments.md's table of the task on stimsim-mnv2-s0, and the readouts following the sequences."""
    from docs_figures import REPO, table_cell
    from stimsim.cli import main

    shared_data("natural/floc")
    base_network("mobilenet_v2")
    out = tmp_path / "run"
    assert main(["run", str(REPO / "experiments" / "sequence2afc.toml"), "--out", str(out), "--threads", "1",
                 "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    page = REPO / "docs" / "experiments.md"

    def cell(key):
        label = next(row for row in _table_labels(page) if f"`{key}`" in row)
        return table_cell(page, label, "stimsim-mnv2-s0")

    assert cell("control_step_auc_mean") == pytest.approx([summary["control_step_auc_mean"]], abs=5e-4)
    assert summary["control_step_auc_mean"] > summary["control_step_auc_chance"] == 0.5
    assert cell("median_slope_to_noise") == pytest.approx([summary["median_slope_to_noise"]], abs=5e-3)
    assert cell("sequence_response_change_sd") == pytest.approx(
        [summary["sequence_response_change_sd"], summary["sequence_others_change_sd"]], abs=5e-3)
    for key in ("mean_own_delta_auc", "mean_cross_abs_delta_auc", "mean_locality_abs_delta_auc"):
        assert cell(key) == pytest.approx([summary[key], *summary[f"{key}_ci"]], abs=5e-5), key
    assert summary["n_sites"] == 12 and summary["mean_own_delta_auc_ci"][0] > 0  # "the interval excludes 0"
    assert summary["mean_locality_abs_delta_auc_ci"][0] < 0 < summary["mean_locality_abs_delta_auc_ci"][1]


def _table_labels(page: Path) -> list[str]:
    from docs_figures import table_rows

    return [row[0] for row in table_rows(page)]

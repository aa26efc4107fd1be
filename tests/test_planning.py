"""Site planning: constraints and ranking, sequences along a site's tuning, the 2AFC rehearsal, sessions."""
import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from stimsim.behavior.metrics import auc_of_curve
from stimsim.paradigms.sequence_2afc import TaskSpec, fit_readouts
from stimsim.planning.selection import (SelectionSpec, choose_sites, rank_sites, ranking_reliability, separation_mm,
                                        shortfall_message)
from stimsim.planning.session import simulate_trials, write_session_csv, write_session_nwb
from stimsim.planning.tasks.sequence_2afc import rehearse
from stimsim.sequences import SequenceSpec, build_sequences, excursion_warning, pooling_matrix
from stimsim.utilities.errors import ConfigError


# --- ranking and constraints ------------------------------------------------------------------------
def test_rank_sites_largest_first_nan_last():
    assert rank_sites([0.1, np.nan, 0.3, 0.1]).tolist() == [2, 0, 3, 1]


def test_separation_metrics_by_hand():
    assert separation_mm((0, 0), (0.3, 0.4), "euclidean") == pytest.approx(0.5)
    assert separation_mm((0, 0), (0.3, 0.4), "manhattan") == pytest.approx(0.7)


def test_choose_sites_respects_separation_broken_and_count():
    ids = ["1", "2", "3", "4", "5"]
    xy = np.array([[0.0, 0.0], [0.4, 0.0], [0.4, 0.4], [1.2, 0.0], [2.0, 0.0]])
    predicted = np.array([0.05, 0.04, 0.03, 0.02, 0.01])
    # Euclidean 0.5 mm: 2 is 0.4 from 1 (too close); 3 is 0.57 from 1 (allowed).
    euclid = choose_sites(ids, xy, predicted, SelectionSpec(n_sites=3, min_separation_mm=0.5, metric="euclidean"))
    assert [ids[i] for i in euclid["chosen"]] == ["1", "3", "4"]
    assert euclid["reason"][1] == "too close to 1" and euclid["reason"][4] == "beyond n_sites"
    # Manhattan 0.9 mm: 2 (0.4) and 3 (0.8) are too close to 1; 4 is 1.2 away; 5 is 0.8 from 4.
    manhattan = choose_sites(ids, xy, predicted, SelectionSpec(n_sites=5, min_separation_mm=0.9, metric="manhattan"))
    assert [ids[i] for i in manhattan["chosen"]] == ["1", "4"]
    assert manhattan["reason"][2] == "too close to 1" and manhattan["reason"][4] == "too close to 4"
    # The same points under Euclidean 0.9 mm: 3 is 0.57 from 1 (too close), 5 is 0.8 from 4 (too close).
    assert [ids[i] for i in choose_sites(ids, xy, predicted, SelectionSpec(n_sites=5, min_separation_mm=0.85))["chosen"]] \
        == ["1", "4"]
    assert [ids[i] for i in choose_sites(ids, xy, predicted, SelectionSpec(n_sites=5, min_separation_mm=0.75,
                                                                             metric="manhattan"))["chosen"]] == ["1", "3", "4", "5"]
    broken = choose_sites(ids, xy, predicted, SelectionSpec(n_sites=2, broken_electrodes=("1",)), unusable=("2",))
    assert [ids[i] for i in broken["chosen"]] == ["3", "4"]
    assert broken["reason"][0] == "broken" and broken["reason"][1] == "unreliable"
    no_prediction = choose_sites(ids, xy, [np.nan, 0.04, 0.03, 0.02, 0.01], SelectionSpec(n_sites=5))
    assert 0 not in no_prediction["chosen"] and no_prediction["reason"][0] == "no prediction"


def test_fewer_sites_than_asked_are_explained():
    """A separation or a count no array can meet plans fewer sites than asked, and says why."""
    ids = ["1", "2", "3", "4", "5"]
    xy = np.array([[0.0, 0.0], [0.4, 0.0], [0.4, 0.4], [1.2, 0.0], [2.0, 0.0]])
    predicted = np.array([0.05, 0.04, np.nan, 0.02, 0.01])
    far = SelectionSpec(n_sites=3, min_separation_mm=1e9)
    assert shortfall_message(choose_sites(ids, xy, predicted, far), far) == (
        "1 site(s) chosen of the n_sites = 3 asked: the other working electrodes are 3 within min_separation_mm = "
        "1e+09 of a chosen site, 1 without a prediction")
    many = SelectionSpec(n_sites=10**6)
    assert shortfall_message(choose_sites(ids, xy, predicted, many), many).startswith(
        "4 site(s) chosen of the n_sites = 1000000 asked: the other working electrodes are 1 without a prediction")
    enough = SelectionSpec(n_sites=2)
    assert shortfall_message(choose_sites(ids, xy, predicted, enough), enough) is None


@pytest.mark.parametrize("metric, steps", [("manhattan", {(1, 1), (2, 0), (0, 2)}), ("euclidean", {(2, 0), (0, 2)})])
def test_sites_exactly_min_separation_apart_on_a_utah_grid_are_both_chosen(metric, steps):
    """Every pair of 10×10 Utah electrodes exactly two pitches (0.8 mm) apart, by grid cells counted by hand (ids
    row by row from the bottom-left, corners unconnected), is allowed under min_separation_mm = 0.8; one pitch
    (0.4 mm) is refused."""
    from stimsim.lab.arrays import utah_array

    layout = utah_array("10x10")
    corners = {(0, 0), (0, 9), (9, 0), (9, 9)}
    cell_of = {str(k + 1): cell for k, cell in enumerate(
        (col, row) for row in range(10) for col in range(10) if (col, row) not in corners)}
    spec = SelectionSpec(n_sites=3, min_separation_mm=0.8, metric=metric)
    pairs = [(a, b) for a in cell_of for b in cell_of
             if (abs(cell_of[a][0] - cell_of[b][0]), abs(cell_of[a][1] - cell_of[b][1])) in steps]
    assert len(pairs) > 100
    for a, b in pairs:
        xy = np.array([layout.position_of(a), layout.position_of(b)])
        assert choose_sites([a, b], xy, np.array([0.02, 0.01]), spec)["chosen"].tolist() == [0, 1], (a, b, xy)
    one_pitch = choose_sites(["12", "13"], np.array([layout.position_of("12"), layout.position_of("13")]),
                             np.array([0.02, 0.01]), spec)
    assert one_pitch["chosen"].tolist() == [0] and one_pitch["reason"][1] == "too close to 12"


def test_map_labels_drop_the_text_prefix_all_ids_share_and_keep_their_numbers():
    from stimsim.planning.report import map_labels

    assert map_labels(["elec1", "elec10", "elec96"]) == ("elec", ["1", "10", "96"])
    assert map_labels(["elec10", "elec11", "elec12"]) == ("elec", ["10", "11", "12"])  # not "elec1"
    assert map_labels(["1", "2", "96"]) == ("", ["1", "2", "96"])
    assert map_labels(["ch", "ch2"]) == ("", ["ch", "ch2"])  # no id left empty
    assert map_labels(["A-01", "B-02"]) == ("", ["A-01", "B-02"])


def test_ranking_reliability_by_hand_and_from_planted_variance_components():
    # by hand: site means 2, 3, 7 → MS_between = 2 × 7 = 14; every site's variance over its 2 sequences is 2
    by_hand = np.array([[1.0, 3.0], [2.0, 4.0], [6.0, 8.0], [np.nan, 1.0]])  # the NaN site is left out
    assert ranking_reliability(by_hand) == pytest.approx((14 - 2) / 14)
    # planted: site effect SD 1, sequence noise SD 2, k = 4 → ICC(1,k) = 1 / (1 + 2² / 4) = 0.5
    rng = np.random.default_rng(0)
    site = rng.normal(0, 1, (2000, 1))
    assert ranking_reliability(site + rng.normal(0, 2, (2000, 4))) == pytest.approx(0.5, abs=0.05)
    assert ranking_reliability(rng.normal(0, 2, (2000, 4))) == pytest.approx(0.0, abs=0.1)  # chance: no site effect
    assert np.isnan(ranking_reliability(np.ones((5, 1))))  # one sequence per site: undefined
    assert np.isnan(ranking_reliability(np.ones((5, 3))))  # no spread of site means: undefined


def test_the_map_draws_every_electrode_of_the_layout_by_its_kind():
    """Every layout electrode gets a kind, recorded or not: broken wins (a broken electrode may be absent from the
    recordings too), then not recorded, then chosen, working, and recorded but not rehearsed (unreliable)."""
    from stimsim.planning.report import ELECTRODE_ID_STYLES, electrode_kinds

    kinds = electrode_kinds(array_ids=["1", "2", "3", "4", "5", "6", "7"], recorded=["1", "2", "3", "4", "5"],
                            working=["1", "2", "3"], broken=["4", "6"], chosen=["1"])
    assert kinds == {"1": "chosen", "2": "working", "3": "working", "4": "broken", "5": "not rehearsed",
                     "6": "broken", "7": "not recorded"}
    assert set(kinds.values()) <= set(ELECTRODE_ID_STYLES)
    colours = {kind: style["color"] for kind, style in ELECTRODE_ID_STYLES.items()}
    assert len(set(colours.values())) == len(colours)  # each kind's id reads apart from the others


def test_the_curves_panels_titles_keep_apart_and_state_the_drawn_and_predicted_effects(monkeypatch):
    """The P(high) panels of the four best-ranked chosen sites: each title names its electrode, the ΔAUC of the drawn
    curves (mean over sequences) and the plan's prediction, inside its own column of the figure."""
    from stimsim.planning.tasks import sequence_2afc

    drawn_figures = []
    monkeypatch.setattr(sequence_2afc, "figure_png", drawn_figures.append)
    rng = np.random.default_rng(0)
    delta_auc = rng.uniform(0.001, 0.01, (6, 1, 3))
    rehearsals = {"m": {"p_high": rng.uniform(0, 1, (6, 2, 3, 7)), "delta_auc": delta_auc}}
    plan = {"choice": {"chosen": np.array([4, 0, 2, 5, 1]), "order": np.arange(6)},
            "predicted": np.array([0.0101, 0.002, 0.0089, 0.001, 0.0123, 0.007])}
    working = [f"elec{i}" for i in (96, 1, 42, 7, 88, 13)]
    sequence_2afc.curves_figure(rehearsals, plan, working, "m")
    fig = drawn_figures[0]
    renderer = fig.canvas.get_renderer()
    titles = [ax.title for ax in fig.axes]
    assert [t.get_text().splitlines()[0] for t in titles] == ["electrode elec88", "electrode elec96",
                                                              "electrode elec42", "electrode elec13"]
    for title, site in zip(titles, (4, 0, 2, 5)):
        assert f"ΔAUC of these curves {delta_auc[site, 0].mean():.3f}" in title.get_text()
        assert f"plan (mean over candidates) {plan['predicted'][site]:.3f}" in title.get_text()
    boxes = [title.get_window_extent(renderer) for title in titles]
    for left, right in zip(boxes, boxes[1:]):
        assert left.x1 < right.x0  # no two titles overlap


def test_unknown_broken_electrode_is_an_error():
    with pytest.raises(ConfigError, match=r"unknown electrode id\(s\) \['99'\]"):
        choose_sites(["1", "2"], np.zeros((2, 2)), np.zeros(2), SelectionSpec(broken_electrodes=("99",)))


def test_selection_spec_validation():
    with pytest.raises(ConfigError, match="metric"):
        SelectionSpec(metric="chebyshev")
    with pytest.raises(ConfigError, match="min_separation_mm"):
        SelectionSpec(min_separation_mm=-1.0)


# --- sequences and rehearsal on a shipped model ------------------------------------------------------
@pytest.fixture(scope="module")
def model(one_torch_thread):
    from stimsim.models.registry import load_model

    return load_model("stimsim-topo-s0")


@pytest.fixture(scope="module")
def natural_images():
    from stimsim.data.stimuli import lfw_subset

    return lfw_subset().images[::4]


@pytest.fixture(scope="module")
def small_sequences(model, natural_images):
    sites = np.array([[3.0, 3.0], [6.0, 6.5], [2.0, 7.0], [7.5, 2.5]])
    spec = SequenceSpec(n_sequences=2, iterations=25, learning_rate=0.05, recording_radius_mm=0.5)
    return sites, build_sequences(model, sites, natural_images, spec, seed=0, progress=False)


def test_sequences_move_the_target_site_monotonically_others_stay(model, natural_images, small_sequences):
    from scipy.stats import spearmanr

    sites, seq = small_sequences
    assert seq.images.shape == (4, 2, 7, 32, 32)
    assert seq.images.min() >= 0 and seq.images.max() <= 1
    change = seq.response_change_sd  # natural SDs, relative to the start image
    for site in range(len(sites)):
        for j in range(2):
            # Non-decreasing along the steps (the low end may floor where the site's units fall silent).
            assert np.all(np.diff(change[site, j]) > -0.05), (site, j, change[site, j])
            assert spearmanr(np.arange(7), change[site, j]).statistic > 0.85
    # Every sequence moves its site by more than 1.5 natural SDs end to end, from a start image the site
    # responds to: site 0 is silent for 30 of the 50 images (its median response is 0), and a sequence
    # started on one of those has no gradient to follow.
    span = change[:, :, -1] - change[:, :, 0]
    assert np.all(span > 1.5), span
    pool = pooling_matrix(model.sheet("IT"), sites, 0.5)
    natural = (model.activations(list(natural_images), "IT") @ pool.T).numpy()
    assert np.mean(natural[:, 0] == 0) == pytest.approx(0.6)
    assert np.all(seq.site_response[:, :, 3] > 0)  # step 3 is the start image
    # The other sites move less than the target at the high end (RMS over them, in their SDs).
    assert np.all(seq.others_change_sd[:, :, -1] < change[:, :, -1])
    # Independent recomputation of the recorded site responses from the images.
    activity = model.activations(list(seq.images[1, 0]), "IT")
    np.testing.assert_allclose((activity @ pool.T)[:, 1].numpy(), seq.site_response[1, 0], rtol=1e-4, atol=1e-5)


def test_excursion_warning_flags_sequences_that_do_not_move_their_sites(small_sequences):
    _, seq = small_sequences
    assert excursion_warning(seq.site_response, seq.natural_sd, 0.5) is None  # these move > 1.5 SD (above)
    # Planted: 2 sites × 3 sequences, end-to-end changes 0.2, 0.4, 0.6 SD (site 0) and 0.8, 3, 5 SD of SD 2
    # (site 1): the median of the six |changes| in SDs is (0.6 + 0.8) / 2 = 0.7 < 1.
    ends = np.array([[0.2, 0.4, 0.6], [1.6, 6.0, 10.0]])
    response = np.zeros((2, 3, 7))
    response[..., -1] = ends
    message = excursion_warning(response, np.array([1.0, 2.0]), 0.25)
    assert message is not None and "0.70 natural SDs" in message and "recording_radius_mm" in message
    response[0, :, -1] = -np.array([2.0, 3.0, 4.0])  # now a move down counts as much as a move up: median 3
    assert excursion_warning(response, np.array([1.0, 2.0]), 0.25) is None


def test_rehearsal_control_matches_the_decoders_and_delta_auc_by_hand(model, small_sequences):
    sites, seq = small_sequences
    readouts, noise_sd = fit_readouts(model, seq.images, pooling_matrix(model.sheet("IT"), sites, 0.5),
                                      TaskSpec(n_noise=8), seed=0, progress=False)
    assert noise_sd.shape == (4, 2) and np.all(noise_sd > 0)
    stimulation = {"current_uA": 50.0, "frequency_Hz": 200.0, "pulse_width_ms": 0.2}
    far = np.array([[9.8, 0.2]] * 4)  # a corner far from every site
    points = np.stack([sites, far], axis=1)
    spec = TaskSpec(n_noise=8, n_eval=6, noise_sd=0.15)
    result = rehearse(model, seq.images, points, stimulation, readouts, spec, seed=5, progress=False)
    assert result.p_high.shape == (4, 3, 2, 7)
    # Control P(high) = mean over the noisy copies of sigmoid(features · w + b), computed here without the
    # engine, with the same seeded noise (site 0 draws first).
    noisy = np.clip(seq.images[0].reshape(-1, 32, 32)[:, None]
                    + np.random.default_rng([5, 0xE7A1]).normal(0.0, 0.15, (14, 6, 32, 32)), 0, 1).astype(np.float32)
    features = model.activations(list(noisy.reshape(-1, 32, 32)), "IT").double().view(2, 7, 6, -1)
    w, b = readouts.weight[1], readouts.bias[1]
    np.testing.assert_allclose(result.p_high[0, 0, 1], torch.sigmoid(features[1] @ w + b).mean(-1).numpy(), atol=1e-5)
    # The decoders separate their ends without stimulation.
    assert np.all(result.p_high[:, 0, :, -1] > result.p_high[:, 0, :, 0])
    # ΔAUC by hand: trapezoid over steps scaled to [0, 1], stimulated minus control.
    x = np.linspace(0, 1, 7)
    hand = np.trapezoid(result.p_high[:, 1], x, axis=-1) - np.trapezoid(result.p_high[:, 0], x, axis=-1)
    np.testing.assert_allclose(result.delta_auc[:, 0], hand, atol=1e-12)
    np.testing.assert_allclose(auc_of_curve(x, result.p_high[0, 0, 0]), np.trapezoid(result.p_high[0, 0, 0], x))
    # Stimulating the site the sequence drives pushes choices towards "high" more than stimulating far away.
    assert result.delta_auc[:, 0].mean() > 0
    assert result.delta_auc[:, 0].mean() > abs(result.delta_auc[:, 1].mean())


def test_sequence_spec_validation():
    with pytest.raises(ConfigError, match="odd"):
        SequenceSpec(n_steps=6)
    with pytest.raises(ConfigError, match="max_sd"):
        SequenceSpec(max_sd=0)


# --- sessions ---------------------------------------------------------------------------------------
def _planted_p_high():
    rng = np.random.default_rng(0)
    sham = np.linspace(0.1, 0.9, 7)
    values = np.empty((3, 2, 2, 7))
    values[:, 0] = sham
    values[:, 1] = np.clip(sham + np.array([0.0, 0.1, 0.2])[:, None, None], 0, 1)
    values += rng.normal(0, 0.0, values.shape)
    return xr.DataArray(values, dims=("electrode", "stimulated", "sequence", "step"),
                        coords={"electrode": ["4", "17", "33"], "stimulated": [False, True]})


def test_session_trials_follow_the_planted_probabilities():
    trials = simulate_trials(_planted_p_high(), trials_per_site=2800, lapse_rate=0.1, current_uA=50.0, seed=3,
                             subject_id="virtual-2", session_id="s1")
    assert list(trials.columns) == ["start_time", "stop_time", "stimulus_id", "electrode", "sequence", "step",
                                    "stimulated_electrode", "current_uA", "choice", "correct", "subject_id",
                                    "session_id"]
    assert len(trials) == 3 * 2800
    for electrode, site in trials.groupby("electrode"):
        stimulated = site["stimulated_electrode"] != "sham"
        assert stimulated.sum() == 1400  # interleaved 50/50
        assert set(site.loc[stimulated, "stimulated_electrode"]) == {electrode}
    sham = trials["stimulated_electrode"] == "sham"
    assert (trials.loc[sham, "current_uA"] == 0).all() and (trials.loc[~sham, "current_uA"] == 50).all()
    assert set(trials["choice"]) == {"low", "high"}
    assert trials["stimulus_id"].iloc[0] == f"{trials['electrode'].iloc[0]}_seq{trials['sequence'].iloc[0]}_step{trials['step'].iloc[0]}"
    middle = trials["step"] == 3
    assert not trials.loc[middle, "correct"].any()
    expected_correct = np.where(trials["step"] < 3, trials["choice"] == "low", trials["choice"] == "high")
    assert (trials.loc[~middle, "correct"] == expected_correct[~middle.values]).all()
    # P(high) = lapse/2 + (1 - lapse) P: electrode "33" stimulated at step 0 has P = 0.05 + 0.9 * 0.3 = 0.32.
    cell = trials[(trials.electrode == "33") & ~sham & (trials.step == 0)]
    observed = (cell["choice"] == "high").mean()
    assert abs(observed - 0.32) < 4 * np.sqrt(0.32 * 0.68 / len(cell))
    assert np.all(np.diff(trials["start_time"]) > 0)


def test_an_odd_trial_count_stimulates_half_of_the_trials_give_or_take_the_last():
    for seed in range(10):
        trials = simulate_trials(_planted_p_high(), trials_per_site=29, lapse_rate=0.0, current_uA=50.0, seed=seed)
        stimulated = (trials["stimulated_electrode"] != "sham").groupby(trials["electrode"]).sum()
        assert set(stimulated) <= {14, 15}, (seed, stimulated.to_dict())


def test_session_nwb_round_trip_with_plain_pynwb(tmp_path):
    from pynwb import NWBHDF5IO

    trials = simulate_trials(_planted_p_high(), trials_per_site=28, lapse_rate=0.02, current_uA=50.0, seed=1,
                             subject_id="virtual-2", session_id="s1")
    path = write_session_nwb(trials, tmp_path / "session.nwb", subject_id="virtual-2", session_id="s1")
    with NWBHDF5IO(str(path), "r") as io:
        nwbfile = io.read()
        table = nwbfile.trials.to_dataframe().reset_index(drop=True)
        assert nwbfile.subject.subject_id == "virtual-2" and nwbfile.session_id == "s1"
    for column in ("stimulus_id", "electrode", "sequence", "step", "stimulated_electrode", "current_uA", "choice",
                   "correct", "start_time", "stop_time"):
        assert column in table
    pd.testing.assert_series_equal(table["choice"], trials["choice"], check_names=False)
    assert table["current_uA"].tolist() == trials["current_uA"].tolist()
    csv_path = write_session_csv(trials, tmp_path / "session.csv")
    assert pd.read_csv(csv_path, dtype={"electrode": str}).shape == trials.shape


def test_session_validation():
    with pytest.raises(ConfigError, match="trials_per_site"):
        simulate_trials(_planted_p_high(), trials_per_site=1, lapse_rate=0.0, current_uA=50.0)
    with pytest.raises(ConfigError, match="lapse_rate"):
        simulate_trials(_planted_p_high(), trials_per_site=10, lapse_rate=1.5, current_uA=50.0)
    for seed in (-1, 2**40):
        with pytest.raises(ConfigError, match=r"seed must be an integer from 0 to 4294967295"):
            simulate_trials(_planted_p_high(), trials_per_site=14, lapse_rate=0.0, current_uA=50.0, seed=seed)
    for current_uA in (-50.0, 0.0, float("inf"), float("nan"), True):  # inf was written into the session's table
        with pytest.raises(ConfigError, match=r"current_uA must be the stimulation's current, a finite number > 0 µA"):
            simulate_trials(_planted_p_high(), trials_per_site=14, lapse_rate=0.0, current_uA=current_uA)
    with pytest.raises(ConfigError, match=r"lapse_rate must be a number in \[0, 1\], got True"):  # True read as 1
        simulate_trials(_planted_p_high(), trials_per_site=14, lapse_rate=True, current_uA=50.0)
    assert len(simulate_trials(_planted_p_high(), trials_per_site=14, lapse_rate=np.float32(0.1), current_uA=50.0))
    with pytest.raises(ConfigError, match=r"p_high must be a DataArray with the dimensions \('electrode', "
                                          r"'stimulated', 'sequence', 'step'\) .*got \('electrode', 'stimulated', "
                                          r"'step'\)"):
        simulate_trials(_planted_p_high().isel(sequence=0), trials_per_site=14, lapse_rate=0.0, current_uA=50.0)


def test_bootstrap_pose_off_the_sheet_has_no_prediction(model, small_sequences):
    from types import SimpleNamespace

    from stimsim.planning.plan import _rehearsal_phase, off_sheet
    from stimsim.planning.tasks import get_plan_task
    from stimsim.stimulation import SafetyLimits

    sites, seq = small_sequences
    sheet = model.sheet("IT")
    x0, x1, y0, y1 = sheet.extent_mm
    assert off_sheet(sheet, np.array([[x1 + 0.01, 5.0], [5.0, y0 - 0.01], [5.0, 5.0]])).tolist() == [True, True, False]
    points = np.stack([sites, sites + 0.05, sites + [[0.0, 20.0]]], axis=1)  # third "pose" is off the sheet
    config = SimpleNamespace(plan_task=get_plan_task("sequence_2afc"), seed=0,
                             task_options=SimpleNamespace(sequences=SequenceSpec(recording_radius_mm=0.5),
                                                          decoder=TaskSpec(n_noise=4, n_eval=2)))
    engine = {"safety_limits": SafetyLimits(), "safety_override": None, "scheduler": None}
    result = _rehearsal_phase(config, model, {"images": seq.images}, points, {"current_uA": 50.0}, progress=False,
                              engine=engine)
    assert np.isnan(result["delta_auc"][:, 2]).all() and np.isfinite(result["delta_auc"][:, :2]).all()
    assert np.isnan(result["p_high"][:, 3]).all() and np.isfinite(result["p_high"][:, :3]).all()
    fitted_off = points[:, :2].copy()
    fitted_off[0, 0] = (x1 + 0.05, sites[0, 1])  # the fitted registration maps site 0 just off the sheet
    result = _rehearsal_phase(config, model, {"images": seq.images}, fitted_off, {"current_uA": 50.0}, progress=False,
                              engine=engine)
    assert np.isnan(result["delta_auc"][0, 0]).all() and np.isfinite(result["delta_auc"][1:]).all()


def _accelerator(name: str):
    available = torch.cuda.is_available() if name == "cuda" else (
        hasattr(torch.backends, "mps") and torch.backends.mps.is_available())
    return pytest.param(name, marks=pytest.mark.skipif(not available, reason=f"no {name} device on this machine"))


@pytest.mark.parametrize("device", [_accelerator("cuda"), _accelerator("mps")])
def test_sequences_and_rehearsal_on_a_gpu_agree_with_the_cpu(device, small_sequences, natural_images):
    from stimsim.models.registry import load_model

    sites, seq = small_sequences
    on_device = load_model("stimsim-topo-s0", device=device)
    assert on_device.device.type == device
    spec = SequenceSpec(n_sequences=2, iterations=25, learning_rate=0.05, recording_radius_mm=0.5)
    moved = build_sequences(on_device, sites, natural_images, spec, seed=0, progress=False)
    # The optimisation runs on the device and does what it does on the CPU: the target site moves by more than
    # 1.5 natural SDs end to end, the images stay in [0, 1].
    assert moved.images.shape == seq.images.shape
    assert moved.images.min() >= 0 and moved.images.max() <= 1
    assert np.median(moved.response_change_sd[:, :, -1] - moved.response_change_sd[:, :, 0]) > 1.5
    # The rehearsal of the same sequences: P(high) within 1e-4 of the CPU's.
    cpu_model = load_model("stimsim-topo-s0")
    readouts, _ = fit_readouts(cpu_model, seq.images, None, TaskSpec(n_noise=8), seed=0, progress=False)
    stimulation = {"current_uA": 50.0, "frequency_Hz": 200.0, "pulse_width_ms": 0.2}
    points = sites[:, None, :]
    spec = TaskSpec(n_noise=8, n_eval=4)
    on_cpu = rehearse(cpu_model, seq.images, points, stimulation, readouts, spec, seed=3, progress=False)
    elsewhere = rehearse(on_device, seq.images, points, stimulation, readouts, spec, seed=3, progress=False)
    np.testing.assert_allclose(elsewhere.p_high, on_cpu.p_high, rtol=0, atol=1e-4)


def test_electrodes_left_out_are_named_with_their_reason():
    """By hand: 1 broken (the lab knows; not reported), 2 constant, 3 NaN reliability, 4 at 0.1 and 5 at 0.3 against
    min_reliability = 0.3 (5 works: the threshold is inclusive), 6 at 0.9."""
    from stimsim.planning.selection import left_out_message, screen_electrodes

    reliability = {"1": 0.9, "2": np.nan, "3": np.nan, "4": 0.1, "5": 0.3, "6": 0.9}
    working, left_out = screen_electrodes(["6", "5", "4", "3", "2", "1"], ["1"], reliability, 0.3, constant=["2"])
    assert working == ["6", "5"]
    assert left_out == {"constant_response": ["2"], "reliability_undefined": ["3"], "below_min_reliability": ["4"]}
    message = left_out_message(left_out, 0.3)
    assert message.startswith("3 recorded electrode(s) left out of the plan as not working — a constant response")
    assert "reliability undefined (in some split, one half's image means do not vary): 1 (3)" in message
    assert message.endswith("split-half reliability below min_reliability = 0.3: 1 (4)")
    # no reliability asked for (min_reliability = -1 on one presentation per image): every electrode that is
    # neither broken nor constant works (a constant channel correlates with nothing)
    assert screen_electrodes(["1", "2", "3"], ["1"], None, -1.0, constant=["2"]) == (
        ["3"], {"constant_response": ["2"], "reliability_undefined": [], "below_min_reliability": []})
    assert left_out_message({"constant_response": [], "reliability_undefined": [], "below_min_reliability": []},
                            0.3) is None
    # listed by id ("e2" before "e10"), not in the array order the screening runs in
    ids = ["e10", "e2", "e33", "e1"]
    assert screen_electrodes(ids, [], dict.fromkeys(ids, 0.0), 0.3)[1]["below_min_reliability"] == [
        "e1", "e2", "e10", "e33"]

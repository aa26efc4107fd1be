"""Experiment and training files: mistakes found early, named with the file and the table."""
from pathlib import Path

import pytest

from stimsim.paradigms import load_experiment, parse_experiment
from stimsim.training.loop import load_training_config
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError, FileFormatError

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _afraz() -> dict:
    return load_toml(EXPERIMENTS / "afraz2006.toml")


def test_a_nul_in_the_name_is_refused_when_the_file_is_read():
    raw = _afraz()
    raw["name"] = "afraz\x00run"
    with pytest.raises(ConfigError, match=r"x.toml: 'name' must be printable text without control characters"):
        parse_experiment(raw, where="x.toml")


@pytest.mark.parametrize("seed", [2**70, 2**32, -1])
def test_a_seed_outside_what_the_random_generators_take_is_refused(seed):
    raw = _afraz()
    raw["seed"] = seed
    with pytest.raises(ConfigError, match=r"x.toml: 'seed' must be (<= 4294967295|>= 0)"):
        parse_experiment(raw, where="x.toml")


@pytest.mark.parametrize("file, replace, message", [
    ("afraz2006.toml", {"frequency_Hz": 0}, r"frequency_Hz must be > 0 Hz: electrical stimulation at 0 delivers"),
    ("muscimol_categorization.toml", {"volume_uL": 0}, r"volume_uL must be > 0 µL: muscimol stimulation at 0"),
    ("muscimol_categorization.toml", {"kind": "optogenetic", "volume_uL": None, "power_mW": 0},
     r"power_mW must be > 0 mW: optogenetic stimulation at 0"),
    ("afraz2006.toml", {"frequency_Hz": -5},
     r"frequency_Hz must be in \[0, 1000\] Hz, got -5 \(0 delivers nothing: a null control in code, refused in a "
     r"file\)"),
    ("muscimol_categorization.toml", {"additive_scale": "activation"},
     r"additive_scale sets the scale of electrical stimulation's additive form; kind 'muscimol' has no such form"),
])
def test_stimulation_that_delivers_nothing_is_refused(file, replace, message):
    raw = load_toml(EXPERIMENTS / file)
    for key, value in replace.items():
        if value is None:
            del raw["stimulation"][key]
        else:
            raw["stimulation"][key] = value
    with pytest.raises(ConfigError, match=r"x.toml \[stimulation\]: " + message):
        parse_experiment(raw, where="x.toml")


def test_a_current_given_as_text_is_refused_with_its_unit_once():
    raw = _afraz()
    raw["stimulation"]["current_uA"] = "fifty"
    with pytest.raises(ConfigError, match=r"\[stimulation\]: current_uA must be a number in µA, got 'fifty'$"):
        parse_experiment(raw, where="x.toml")


def test_training_seed_is_bounded_too():
    raw = load_toml(EXPERIMENTS / "train_stimsim_topo_seed0.toml")
    raw["training"]["seed"] = 2**70
    with pytest.raises(ConfigError, match=r"\[training\]: 'seed' must be <= 4294967295"):
        load_training_config(raw)


def test_a_file_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('name = "Müller"\n'.encode("latin-1"))
    with pytest.raises(FileFormatError, match=rf"{path}: not UTF-8 text") as error:
        load_experiment(path)
    assert error.value.path == path


def test_error_locations_name_the_file_then_the_table():
    raw = _afraz()
    raw["stimulation"]["current_mA"] = 1
    with pytest.raises(ConfigError, match=r"x\.toml \[stimulation\]"):
        parse_experiment(raw, where="x.toml")
    raw = _afraz()
    raw["stimuli"]["noise"]["signal_percent"] = [150]
    with pytest.raises(ConfigError, match=r"x\.toml \[stimuli\.noise\]: 'signal_percent'"):
        parse_experiment(raw, where="x.toml")


def test_a_confidence_level_given_as_a_percentage_is_refused_as_a_fraction():
    raw = _afraz()
    raw["analysis"]["ci"] = 95
    with pytest.raises(ConfigError, match=r"^x\.toml \[analysis\]: 'ci' must be < 1(\.0)?, got 95; it is a fraction: "
                                          r"0\.95 for 95 %$"):
        parse_experiment(raw, where="x.toml")
    raw["analysis"]["ci"] = 150  # not a percentage either: the bound alone
    with pytest.raises(ConfigError, match=r"'ci' must be < 1(\.0)?, got 150$"):
        parse_experiment(raw, where="x.toml")


def test_a_bound_of_1_that_is_no_proportion_gives_no_percentage_hint():
    """Momentum (0.9 typical) is bounded by 1 but is no proportion: 9 is most likely 0.9, not 9 %; the error
    states the bound alone. A proportion, such as the subject's lapse rate, keeps the hint."""
    raw = load_toml(EXPERIMENTS / "train_stimsim_topo_seed0.toml")
    raw["training"]["momentum"] = 9
    with pytest.raises(ConfigError, match=r"\[training\]: 'momentum' must be <= 1(\.0)?, got 9$"):
        load_training_config(raw)
    raw = _afraz()
    raw["decoder"]["fit_fraction"] = 50
    with pytest.raises(ConfigError, match=r"'fit_fraction' must be < 1(\.0)?, got 50; it is a fraction: 0\.5 for "
                                          r"50 %$"):
        parse_experiment(raw, where="x.toml")


@pytest.mark.parametrize("key, value, message", [
    ("layer", "trunk.18", "'layer': layer 'trunk.18' has no cortical sheet; topographic layers: "),
    ("layer", "V9", "'layer': unknown layer 'V9'; stages: "),
    ("model", "no-such-model", "'model': unknown model 'no-such-model': not one of the shipped models"),
])
def test_a_layer_or_model_the_run_cannot_use_names_the_file_and_key(tmp_path, capsys, key, value, message):
    from stimsim.cli import main

    raw = (EXPERIMENTS / "afraz2006.toml").read_text()
    path = tmp_path / "x.toml"
    path.write_text(raw.replace(f'{key} = "{"IT" if key == "layer" else "stimsim-mnv2-s0"}"', f'{key} = "{value}"', 1))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stimsim: error: {path}: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_site_given_twice_and_list_lengths_are_refused_in_plain_words():
    raw = load_toml(EXPERIMENTS / "muscimol_categorization.toml")
    raw["sites"] = {"method": "explicit", "sites_mm": [[2.0, 2.0], [4.0, 1.0], [2.0, 2.0]]}
    with pytest.raises(ConfigError, match=r"x\.toml \[sites\]: 'sites_mm' gives the site \[2\.0, 2\.0\] more than once"):
        parse_experiment(raw, where="x.toml")
    raw["sites"]["sites_mm"] = [[2.0, 2.0, 1.0]]
    with pytest.raises(ConfigError, match=r"x\.toml \[sites\]: 'sites_mm' must hold at most 2 item\(s\), got \[2\.0, 2\.0, 1\.0\]"):
        parse_experiment(raw, where="x.toml")
    raw["sites"]["sites_mm"] = []
    with pytest.raises(ConfigError, match=r"'sites_mm' must hold at least 1 item\(s\), got \[\]"):
        parse_experiment(raw, where="x.toml")


def test_a_file_saved_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + (EXPERIMENTS / "afraz2006.toml").read_bytes())
    assert load_toml(path) == load_toml(EXPERIMENTS / "afraz2006.toml")


def test_a_decoder_layer_the_model_lacks_names_the_file(tmp_path, capsys):
    from stimsim.cli import main

    path = tmp_path / "x.toml"
    path.write_text('name = "x"\nparadigm = "categorization"\nmodel = "stimsim-topo-s0"\n'
                    '[stimuli]\nsets = [{ source = "lfw_subset" }]\nlabel = "category"\npositive = "face"\n'
                    'n_per_choice = 10\n[stimuli.noise]\nsignal_percent = [0, 100]\n'
                    '[decoder]\nlayer = "V9"\n[sites]\nmethod = "explicit"\nsites_mm = [[2.0, 2.0]]\n'
                    '[stimulation]\nkind = "electrical"\ncurrent_uA = 50\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith(f"stimsim: error: {path} [decoder]: 'layer': unknown layer 'V9'")


def test_a_margin_wider_than_the_sheet_names_the_file_the_table_and_the_margins_allowed(tmp_path, capsys):
    from stimsim.cli import main

    path = tmp_path / "x.toml"
    path.write_text('name = "x"\nparadigm = "categorization"\nmodel = "stimsim-topo-s0"\n'
                    '[stimuli]\nsets = [{ source = "lfw_subset" }]\nlabel = "category"\npositive = "face"\n'
                    'n_per_choice = 10\n[stimuli.noise]\nsignal_percent = [0, 100]\n'
                    '[sites]\nmethod = "grid"\ngrid_step_mm = 1.0\nmargin_mm = 500.0\n'
                    '[stimulation]\nkind = "electrical"\ncurrent_uA = 50\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"stimsim: error: {path}: [sites] 'margin_mm' = 500 mm leaves no room on sheet 'it' "
                            "(extent x ["), error
    assert error.rstrip().endswith("mm); give 0 to 9.857 mm"), error


def test_a_preferred_class_no_image_has_names_the_table_it_came_from(tmp_path, capsys):
    """Without [sites.localizer] the localizer is the experiment's own images and [stimuli] 'positive': a class that
    no image has is named there, not in a table the file does not have."""
    from stimsim.cli import main

    path = tmp_path / "x.toml"
    path.write_text('name = "x"\nparadigm = "categorization"\nmodel = "stimsim-topo-s0"\n'
                    '[stimuli]\nsets = [{ source = "lfw_subset" }]\nlabel = "category"\npositive = "faces"\n'
                    'n_per_choice = 10\n[stimuli.noise]\nsignal_percent = [0, 100]\n'
                    '[sites]\nmethod = "explicit"\nsites_mm = [[2.0, 2.0]]\n'
                    '[stimulation]\nkind = "electrical"\ncurrent_uA = 50\n')
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith(
        f"stimsim: error: {path} [stimuli] (its images are the localizer's: [sites.localizer] 'positive', or the "
        "paradigm's preferred class, e.g. [stimuli] 'positive', when the file has no [sites.localizer]): no localizer "
        "image has category = 'faces'; values: ['face', 'nonface']")


def test_an_unknown_stimulation_key_lists_the_keys_the_file_may_give():
    """sites_mm and layer come from [sites] and 'layer' (the file refuses them in [stimulation]); additive_scale
    belongs to the table."""
    raw = _afraz()
    raw["stimulation"]["curent_uA"] = 50.0
    with pytest.raises(ConfigError) as caught:
        parse_experiment(raw, where="x.toml")
    allowed = str(caught.value).split("allowed keys: ")[1].split(", ")
    assert str(caught.value).startswith("x.toml [stimulation]: unknown key(s) ['curent_uA']")
    assert {"kind", "current_uA", "frequency_Hz", "additive_scale"} <= set(allowed)
    assert not {"sites_mm", "layer", "combine"} & set(allowed)


def test_combine_is_refused_since_an_experiment_stimulates_one_site_at_a_time():
    """'combine' joins the electrodes of one perturbation; each condition of an experiment has one, so the key would
    change nothing."""
    raw = _afraz()
    raw["stimulation"]["combine"] = "max"
    with pytest.raises(ConfigError, match=r"x.toml \[stimulation\]: 'combine' joins several electrodes .* remove it"):
        parse_experiment(raw, where="x.toml")


@pytest.mark.parametrize("command, file, kind, reader", [
    (["run"], "plan_default.toml", "a plan file", "stimsim plan"),
    (["run"], "train_stimsim_topo_seed0.toml", "a training or build file", "stimsim train"),
    (["plan"], "afraz2006.toml", "an experiment file", "stimsim run"),
    (["plan"], "subject_default.toml", "a virtual subject file", "stimsim subject make"),
    (["visualize"], "moeller2017.toml", "an experiment file", "stimsim run"),
    (["subject", "make"], "plan_default.toml", "a plan file", "stimsim plan"),
    (["train"], "visualize_default.toml", "a percept visualisation file", "stimsim visualize"),
    (["train"], "build_stimsim_mnv2_s0.toml", None, None),  # its own kind: no hint
])
def test_a_file_given_to_another_command_than_its_own_is_named_as_what_it_is(tmp_path, capsys, command, file, kind,
                                                                            reader):
    from stimsim.cli import main

    bad = tmp_path / "file.toml"  # a copy, so that the error comes from the file's keys alone
    text = (EXPERIMENTS / file).read_text()
    bad.write_text(text.replace("steps = 2000", "steps = 0") if kind is None else text)
    assert main([*command, str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.strip().endswith(f"(the file looks like {kind}: give it to `{reader}`)") == (kind is not None), err
    assert "looks like" not in err or kind is not None

"""Virtual subject: hidden pose, pooled recordings with gains and noise, dead electrodes, files."""
import hashlib
import json
import os
import re
import shutil
import tomllib

import numpy as np
import pytest

from stimsim.cli import main
from stimsim.data.stimuli import lfw_subset
from stimsim.lab.arrays import ArrayPose, utah_array
from stimsim.lab.recordings import load_recordings
from stimsim.models.registry import load_model
from stimsim.subject import VirtualSubject
from stimsim.utilities.errors import ConfigError, DataError, FileFormatError


@pytest.fixture(scope="module")
def model():
    return load_model("stimsim-topo-s2")


def _config(**array):
    return {"subject": {"model": "stimsim-topo-s2", "seed": 3},
            "array": {"layout": "8x8", **array},
            "recording": {"radius_mm": 0.3, "repeats": 2, "noise": "none"},
            "stimuli": [{"source": "lfw_subset"}]}


def test_noise_free_recording_is_baseline_plus_gain_times_pooled_units(model, one_torch_thread):
    pose = ArrayPose(5.0, 4.5, 20.0)
    subject = VirtualSubject.create(_config(pose=pose.to_dict(), dead_electrodes=["5"]), model=model)
    images = lfw_subset().subset(np.arange(0, 200, 10))
    recordings = subject.record(images)
    assert recordings.response.sizes == {"presentation": 40, "electrode": 64}
    activations = model.activations(images.images, "IT").numpy().astype(np.float64)
    coords = model.sheet("IT").coordinates_mm * 2.0  # the model records 2 cortex mm per model mm
    means = recordings.per_image().sel(stimulus_id=list(images.stimulus_id))
    for electrode in ("1", "30", "64"):
        site = pose.apply(utah_array("8x8").position_of(electrode))[0]
        near = np.hypot(*(coords - site).T) <= 0.3
        expected = 20.0 + subject.gains_Hz_per_sd[electrode] * activations[:, near].mean(1) / activations.std()
        np.testing.assert_allclose(means.sel(electrode=electrode).values, expected, rtol=1e-6)
    np.testing.assert_allclose(means.sel(electrode="5").values, 20.0)
    assert subject.dead_electrodes == ("5",)
    np.testing.assert_allclose(subject.electrode_sites_mm()["1"], pose.apply(utah_array("8x8").position_of("1"))[0])


def test_array_and_pose_are_cortex_mm_on_a_two_to_one_model(model):
    # a 10×10 Utah array at 0.4 mm pitch spans 9 × 0.4 = 3.6 cortex mm = 1.8 mm of a 2:1 model's sheet
    assert model.cortex_scale("IT")["cortex_mm_per_model_mm"] == 2.0
    config = _config(pose={"x_mm": 10.0, "y_mm": 9.0, "rotation_deg": 0.0})
    config["array"]["layout"] = "10x10"
    subject = VirtualSubject.create(config, model=model)
    cortex = np.array(list(subject.electrode_sites_mm().values()))
    in_model_mm = np.array(list(subject.electrode_sites_model_mm().values()))
    assert np.ptp(cortex[:, 0]) == pytest.approx(3.6) and np.ptp(cortex[:, 1]) == pytest.approx(3.6)
    assert np.ptp(in_model_mm[:, 0]) == pytest.approx(1.8) and np.ptp(in_model_mm[:, 1]) == pytest.approx(1.8)
    assert in_model_mm.mean(0) == pytest.approx((5.0, 4.5))
    # the recorded units are those within 0.3 cortex mm = 0.15 model mm of the electrode on the model's own sheet
    raw = model.sheet("IT").coordinates_mm
    site = np.array(subject.electrode_sites_model_mm()["45"])
    expected = np.flatnonzero(np.hypot(*(raw - site).T) <= 0.15)
    assert sorted(subject.recorded_units()[subject.layout.index_of("45")]) == expected.tolist()
    assert subject.truth()["cortex_mm_per_model_mm"] == 2.0 and not subject.truth()["scale_overridden"]
    # the sheet is converted exactly once: a subject built on an already converted model sees the same sheet
    again = VirtualSubject.create(config, model=subject.model)
    np.testing.assert_allclose(again.sheet.coordinates_mm, subject.sheet.coordinates_mm)
    # an explicit scale overrides the model's and is flagged
    config["subject"]["cortex_mm_per_model_mm"] = 1.0
    config["array"]["pose"] = {"x_mm": 5.0, "y_mm": 4.5, "rotation_deg": 0.0}
    one = VirtualSubject.create(config, model=model)
    assert np.ptp(np.array(list(one.electrode_sites_model_mm().values()))[:, 0]) == pytest.approx(3.6)
    assert one.truth()["scale_overridden"]


def test_a_cmp_layout_gives_the_subject_its_labels_and_spacing(model, tmp_path):
    """A 3×2 Blackrock map labelled elecN, read with [array] layout_ids = "label" and pitch_mm = 0.25: the
    subject's electrodes are the labels, and elec6 (col 2, row 1) lies (2 - 1, 1 - 0.5) × 0.25 mm from the centre."""
    cmp = tmp_path / "array.cmp"
    cmp.write_text("Cerebus mapping for a 6-channel test array\n"
                   + "".join(f"{k % 3}\t{k // 3}\tA\t{k + 1}\telec{k + 1}\n" for k in range(6)))
    pose = {"x_mm": 10.0, "y_mm": 9.0, "rotation_deg": 0.0}
    subject = VirtualSubject.create(_config(layout=str(cmp), layout_ids="label", pitch_mm=0.25, pose=pose),
                                    model=model)
    assert subject.layout.electrode_ids == tuple(f"elec{k}" for k in range(1, 7))
    assert subject.electrode_sites_mm()["elec6"] == pytest.approx((10.0 + 0.25, 9.0 + 0.125))
    assert VirtualSubject.create(_config(layout=str(cmp), pose=pose), model=model).layout.electrode_ids[0] == "1"
    with pytest.raises(ConfigError, match=r"<config> \[array\] pitch_mm: the .cmp map's electrode spacing in mm, "
                                          r"from 0.005 to 5 .*got 400$"):
        VirtualSubject.create(_config(layout=str(cmp), pitch_mm=400.0), model=model)
    with pytest.raises(ConfigError, match=r"<config> \[array\] layout_ids: \"label\" takes the ids from a .cmp"):
        VirtualSubject.create(_config(layout_ids="label"), model=model)
    with pytest.raises(ConfigError, match=r"<config> \[array\] pitch_mm: spaces the grid of a .cmp map; the layout "
                                          r"is '8x8'"):
        VirtualSubject.create(_config(pitch_mm=0.25), model=model)


def test_a_layout_file_beside_the_config_is_copied_into_the_subject_from_any_working_folder(model, tmp_path,
                                                                                           monkeypatch):
    """`stimsim subject make subject.toml` run in the config's own folder: the saved subject holds a copy of the
    layout file its subject.toml names, so that it loads from anywhere."""
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "my_array.csv").write_text("electrode_id,x_mm,y_mm\n"
                                         + "".join(f"e{k},{0.4 * (k % 2)},{0.4 * (k // 2)}\n" for k in range(4)))
    (folder / "subject.toml").write_text('[subject]\nmodel = "stimsim-topo-s2"\nseed = 3\n'
                                         '[array]\nlayout = "my_array.csv"\n'
                                         '[recording]\nradius_mm = 0.3\nrepeats = 2\nnoise = "none"\n'
                                         '[[stimuli]]\nsource = "lfw_subset"\n')
    monkeypatch.chdir(folder)
    subject = VirtualSubject.from_file("subject.toml", model=model)
    subject.save(tmp_path / "subject")
    monkeypatch.chdir(tmp_path)
    assert (tmp_path / "subject" / "my_array.csv").read_text() == (folder / "my_array.csv").read_text()
    loaded = VirtualSubject.load(tmp_path / "subject", model=model)
    assert loaded.layout.electrode_ids == ("e0", "e1", "e2", "e3") == subject.layout.electrode_ids


def test_random_pose_is_seeded_and_keeps_the_array_on_the_sheet(model):
    x0, x1, y0, y1 = 2.0 * np.array(model.sheet("IT").extent_mm)  # cortex mm
    poses = []
    for seed in range(6):
        config = _config(dead_fraction=0.25)
        config["subject"]["seed"] = seed
        subject = VirtualSubject.create(config, model=model)
        sites = np.array(list(subject.electrode_sites_mm().values()))
        assert sites[:, 0].min() >= x0 + 0.3 - 1e-9 and sites[:, 0].max() <= x1 - 0.3 + 1e-9
        assert sites[:, 1].min() >= y0 + 0.3 - 1e-9 and sites[:, 1].max() <= y1 - 0.3 + 1e-9
        assert len(subject.dead_electrodes) == 16
        poses.append(subject.pose)
    assert len({p.rotation_deg for p in poses}) == 6
    assert VirtualSubject.create(_config(), model=model).pose == VirtualSubject.create(_config(), model=model).pose


def test_poisson_noise_gives_the_expected_reliability_ordering(model, one_torch_thread):
    config = _config(dead_electrodes=["1", "2"])
    config["recording"].update(noise="poisson", repeats=4)
    subject = VirtualSubject.create(config, model=model)
    reliability = subject.record().split_half_reliability(seed=0, n_splits=4)
    # dead electrodes record noise only (chance level 0); working ones track the images
    assert np.all(np.abs(reliability.sel(electrode=["1", "2"]).values) < 0.3)
    assert np.median(reliability.drop_sel(electrode=["1", "2"]).values) > 0.5


def test_images_the_models_input_changes_much_are_noted_when_a_subject_is_made(model, tmp_path):
    from PIL import Image

    folder = tmp_path / "images" / "objects"
    folder.mkdir(parents=True)
    Image.fromarray(np.full((10, 1000), 128, dtype=np.uint8)).save(folder / "strip.png")  # 100:1
    Image.fromarray(np.full((1, 1), 128, dtype=np.uint8)).save(folder / "dot.png")  # enlarged 32 × to 32 px
    Image.fromarray(np.full((40, 40), 128, dtype=np.uint8)).save(folder / "square.png")
    config = _config()
    config["stimuli"] = [{"source": "folder", "path": str(tmp_path / "images")}]
    with pytest.warns(UserWarning) as caught:
        VirtualSubject.create(config, model=model).stimuli()
    messages = [str(w.message) for w in caught]
    assert ("<config> [[stimuli]]: 1 of 3 images are over twice as long as wide, and the model sees only their centre "
            "square (e.g. objects/strip.png, 1000 × 10 px)") in messages
    assert ("<config> [[stimuli]]: 1 of 3 images are enlarged over 4 times to the model's 32-px input (e.g. "
            "objects/dot.png, 1 × 1 px)") in messages


def test_a_subject_files_image_folder_is_read_relative_to_the_file_and_saved_so_that_it_runs_again(tmp_path,
                                                                                                    monkeypatch):
    from PIL import Image

    from stimsim.subject.virtual import to_toml
    from stimsim.utilities.config import load_toml

    folder = tmp_path / "lab" / "images" / "objects"
    folder.mkdir(parents=True)
    for i in range(12):
        Image.fromarray(np.full((32, 32), 20 * i, dtype=np.uint8)).save(folder / f"im{i}.png")
    config = _config()
    config["stimuli"] = [{"source": "folder", "path": "images"}]  # beside the subject file, not the working directory
    (tmp_path / "lab" / "subject.toml").write_text(to_toml(config))
    monkeypatch.chdir(tmp_path)
    subject = VirtualSubject.from_file("lab/subject.toml")
    assert len(subject.stimuli()) == 12
    saved = subject.save(tmp_path / "made")
    assert load_toml(saved / "subject.toml")["stimuli"][0]["path"] == str((tmp_path / "lab" / "images").resolve())
    monkeypatch.chdir(tmp_path / "made")
    assert len(VirtualSubject.from_file("subject.toml").stimuli()) == 12  # the saved file runs again from anywhere


def test_bad_subject_configurations_name_file_and_field(model, tmp_path):
    with pytest.raises(ConfigError, match=r"<config> \[array\] dead_electrodes: unknown electrode id\(s\) \['99'\]"):
        VirtualSubject.create(_config(dead_electrodes=["3", "99"]), model=model)
    with pytest.raises(ConfigError, match=r"\[array\] pose: \d+ of 64 electrodes \(\d+(, \d+)*( and \d+ more)?\) "
                                          r"fall off the IT sheet"):
        VirtualSubject.create(_config(pose={"x_mm": 0.5, "y_mm": 5.0}), model=model)
    big = tmp_path / "big.csv"
    # 16 electrodes 2 mm apart in a line, 30 cortex mm: longer than the 19.7 mm sheet's diagonal (27.9 mm)
    big.write_text("electrode_id,x_mm,y_mm\n" + "".join(f"e{i},{2 * i},0\n" for i in range(16)))
    config = _config()
    config["array"]["layout"] = str(big)
    with pytest.raises(ConfigError, match=r"<config> \[array\]: array .* does not fit on the IT sheet"):
        VirtualSubject.create(config, model=model)
    config = _config()
    config["stimuli"] = [{"source": "lfw_subset"}, {"source": "lfw_subset"}]
    with pytest.raises(ConfigError, match=r"\[\[stimuli\]\]: stimulus ids must be unique"):
        VirtualSubject.create(config, model=model).stimuli()
    config = _config()
    config["recording"]["radius_mm"] = 0.001
    with pytest.raises(ConfigError, match="reaches no model unit"):
        VirtualSubject.create(config, model=model)
    with pytest.raises(ConfigError, match=r"<config> \[array\]: give dead_electrodes .* or dead_fraction .*not both"):
        VirtualSubject.create(_config(dead_electrodes=["3"], dead_fraction=0.1), model=model)
    with pytest.raises(ConfigError, match=r"<config> \[array\] layout: array layout file not found: nope.csv"):
        VirtualSubject.create(_config(layout="nope.csv"), model=model)
    config = _config()
    config["recording"]["repeats"] = 10**9  # would need 10^9 × 200 images × 64 electrodes of memory
    with pytest.raises(ConfigError, match=r"\[recording\]: 'repeats' must be <= 1000, got 1000000000"):
        VirtualSubject.create(config, model=model)
    config = _config()
    config["subject"]["cortex_mm_per_model_mm"] = 1e-6  # a sheet of 10 µm: the error names the scale that made it
    with pytest.raises(ConfigError, match=r"'radius_mm' = 0.3 is larger than the model's IT sheet .*; the sheet is "
                                          r"this small at \[subject\] cortex_mm_per_model_mm = 1e-06, the model's own "
                                          r"scale is \d"):
        VirtualSubject.create(config, model=model)
    # numbers in other units or beyond any multi-unit site: refused before any spike count is drawn
    for key, value, message in (("window_ms", [0.07, 0.17], r"'window_ms' = \[0.07, 0.17\] is a window of 0.1 ms; "
                                                             r"give its start and stop in ms"),
                                ("baseline_rate_Hz", 1e12, r"'baseline_rate_Hz' must be <= 1000"),
                                ("gain_log_sd", 20, r"'gain_log_sd' must be <= 3")):
        config = _config()
        config["recording"][key] = value
        with pytest.raises(ConfigError, match=r"\[recording\]: " + message):
            VirtualSubject.create(config, model=model)


def test_an_unknown_subject_model_names_the_file_and_field(tmp_path, capsys):
    from stimsim.cli import main

    config = tmp_path / "subject.toml"
    config.write_text('[subject]\nmodel = "no-such-model"\nseed = 1\n[array]\nlayout = "10x10"\n')
    assert main(["subject", "make", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stimsim: error: {config} [subject]: 'model': unknown model 'no-such-model'")
    assert not (tmp_path / "out").exists()


def test_subject_make_writes_both_formats_and_the_truth(tmp_path, one_torch_thread, capsys):
    config = tmp_path / "subject.toml"
    config.write_text('[subject]\nmodel = "stimsim-topo-s2"\nseed = 4\n[array]\nlayout = "8x8"\n'
                      'dead_fraction = 0.1\n[recording]\nrepeats = 2\n[[stimuli]]\nsource = "lfw_subset"\n')
    out = tmp_path / "subject"
    assert main(["subject", "make", str(config), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    shown = json.loads(captured.out)  # stdout is JSON alone
    assert "virtual subject written to" in captured.err
    assert main(["subject", "make", str(config), "--out", str(tmp_path / "quiet"), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
    assert shown["n_electrodes"] == 64 and shown["n_dead_electrodes"] == 6
    assert {"recordings.nc", "recordings.nwb", "truth.json"} <= set(shown["files"])
    truth = json.loads((out / "truth.json").read_text())
    assert set(truth) >= {"model", "pose", "dead_electrodes", "array", "recording_radius_mm", "gains_Hz_per_sd",
                          "seed"}
    assert len(truth["dead_electrodes"]) == 6
    from_nc = load_recordings(out / "recordings.nc")
    from_nwb = load_recordings(out / "recordings.nwb")
    np.testing.assert_allclose(from_nc.response.values, from_nwb.response.values)
    assert from_nc.response.sizes == {"presentation": 400, "electrode": 64}
    loaded = VirtualSubject.load(out)
    from pynwb import NWBHDF5IO

    with NWBHDF5IO(str(out / "recordings.nwb"), "r") as io:  # the animal: its model and seed
        assert io.read().subject.subject_id == loaded.subject_id == "virtual-stimsim-topo-s2-seed4"
    assert loaded.pose == ArrayPose.from_dict(truth["pose"])
    assert loaded.dead_electrodes == tuple(truth["dead_electrodes"])
    assert loaded.gains_Hz_per_sd == truth["gains_Hz_per_sd"]
    earlier = tmp_path / "earlier"  # a subject made before the gains' unit was in the name
    shutil.copytree(out, earlier)
    truth["gains"] = truth.pop("gains_Hz_per_sd")
    (earlier / "truth.json").write_text(json.dumps(truth))
    checksums = json.loads((earlier / "subject_files.json").read_text())  # as that version recorded it
    checksums["files_sha256"]["truth.json"] = hashlib.sha256((earlier / "truth.json").read_bytes()).hexdigest()
    (earlier / "subject_files.json").write_text(json.dumps(checksums))
    assert VirtualSubject.load(earlier).gains_Hz_per_sd == loaded.gains_Hz_per_sd
    assert list(loaded.stimuli().stimulus_id) == list(lfw_subset().stimulus_id)
    from_nc.check_stimuli(loaded.stimuli().stimulus_id)
    data = bytearray((out / "recordings.nc").read_bytes())  # one byte of the recordings changed afterwards
    data[len(data) // 2] ^= 0xFF
    (out / "recordings.nc").write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"recordings.nc changed since the virtual subject was made"):
        VirtualSubject.load(out)
    bad = tmp_path / "bad.toml"
    bad.write_text(config.read_text().replace('dead_fraction = 0.1', 'dead_electrodes = ["0"]'))
    assert main(["subject", "make", str(bad), "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("edit, key", [
    (lambda truth: truth.pop("pose"), "missing key.*pose"),
    (lambda truth: truth.pop("layout"), "missing key.*layout"),
    (lambda truth: truth.pop("gains_Hz_per_sd"), "missing key.*gains_Hz_per_sd"),
    (lambda truth: truth["pose"].pop("x_mm"), "key 'pose' is malformed.*x_mm"),
    (lambda truth: truth["pose"].update(x_mm="centre"), "key 'pose' is malformed.*x_mm"),
    (lambda truth: truth["layout"].pop("positions_mm"), "key 'layout' is malformed.*positions_mm"),
    (lambda truth: truth.update(dead_electrodes=3), "key 'dead_electrodes' is malformed"),
    (lambda truth: truth.update(dead_electrodes=["no-such-electrode"]), "key 'dead_electrodes' names electrode"),
    (lambda truth: truth["gains_Hz_per_sd"].pop("1"),
     r"key 'gains_Hz_per_sd' gives no gain for electrode\(s\) \['1'\]"),
    (lambda truth: truth.update(gains_Hz_per_sd=[60.0]), "key 'gains_Hz_per_sd' is malformed"),
])
def test_a_hand_edited_truth_file_is_named_with_its_key(model, tmp_path, edit, key):
    """A subject's truth.json edited by hand (its record of checksums updated, or a subject made before that record
    existed) is refused naming the file and the key, not with a KeyError or TypeError."""
    out = VirtualSubject.create(_config(), model=model).save(tmp_path / "subject")
    truth = json.loads((out / "truth.json").read_text())
    edit(truth)
    (out / "truth.json").write_text(json.dumps(truth))
    checksums = json.loads((out / "subject_files.json").read_text())
    checksums["files_sha256"]["truth.json"] = hashlib.sha256((out / "truth.json").read_bytes()).hexdigest()
    (out / "subject_files.json").write_text(json.dumps(checksums))
    with pytest.raises(FileFormatError, match=rf"^{re.escape(str(out / 'truth.json'))}: {key}.*stimsim subject make"):
        VirtualSubject.load(out, model=model)
    (out / "subject_files.json").unlink()
    (out / "truth.json").write_text("[]")
    with pytest.raises(FileFormatError, match=r"truth.json: not a virtual subject's truth \(a JSON object\)"):
        VirtualSubject.load(out, model=model)


def test_a_subject_with_no_working_electrode_or_an_implausible_scale_is_refused(model):
    with pytest.raises(ConfigError, match=r"<config> \[array\] dead_fraction: 0.995 of the 64 electrodes of "
                                          r"'utah_8x8' rounds to all of them, leaving no working electrode; give at "
                                          r"most 0.9844"):
        VirtualSubject.create(_config(dead_fraction=0.995), model=model)
    with pytest.raises(ConfigError, match=r"<config> \[array\] dead_electrodes: lists every electrode of the layout "
                                          r"'utah_8x8' \(64\), leaving no working electrode"):
        VirtualSubject.create(_config(dead_electrodes=[str(i) for i in range(1, 65)]), model=model)
    assert len(VirtualSubject.create(_config(dead_fraction=0.98), model=model).working_electrodes) == 1
    with pytest.raises(ConfigError, match=r"<config> \[array\] layout: array '12x12': give a Utah kind"):
        VirtualSubject.create(_config(layout="12x12"), model=model)
    config = _config()
    config["subject"]["cortex_mm_per_model_mm"] = 1e6  # not "use a larger radius": the scale is what is wrong
    with pytest.raises(ConfigError, match=r"<config> \[subject\]: 'cortex_mm_per_model_mm' must be <= 100"):
        VirtualSubject.create(config, model=model)


def test_dead_electrodes_listed_twice_or_not_ids_are_refused_naming_them(model):
    for listed, shown in ((["3", "5", "3"], "'3'"), ([7, "7", "9", 9], "'7', '9'")):  # 7 and "7" are one electrode
        with pytest.raises(ConfigError, match=rf"<config> \[array\]: 'dead_electrodes' lists {shown} more than once; "
                                              r"give each electrode once"):
            VirtualSubject.create(_config(dead_electrodes=listed), model=model)
    with pytest.raises(ConfigError, match=r"<config> \[array\]: 'dead_electrodes' lists 3.5; give electrode ids"):
        VirtualSubject.create(_config(dead_electrodes=["2", 3.5]), model=model)
    assert VirtualSubject.create(_config(dead_electrodes=[3, "5"]), model=model).dead_electrodes == ("3", "5")


def test_a_given_pose_places_the_array_rigidly_and_refuses_a_scale(model):
    # truth.json's pose (scale 1) can be given as it is. Electrodes 28 and 29 of an 8x8 array (0.4 mm pitch, ids row
    # by row from the bottom left) sit in row 3, columns 3 and 4: 0.2 mm left and right of, and 0.2 mm below, its centre
    pose = {"x_mm": 10.0, "y_mm": 9.0, "rotation_deg": 0.0, "scale": 1.0}
    sites = VirtualSubject.create(_config(pose=pose), model=model).electrode_sites_mm()
    assert sites["28"] == pytest.approx((9.8, 8.8)) and sites["29"] == pytest.approx((10.2, 8.8))
    with pytest.raises(ConfigError, match=r"<config> \[array.pose\]: 'scale' = 2: an implanted array keeps its "
                                          r"layout's spacing, so its pose's scale is 1"):
        VirtualSubject.create(_config(pose={**pose, "scale": 2.0}), model=model)
    with pytest.raises(ConfigError, match=r"<config> \[array.pose\]: unknown key 'rot'; allowed: \['rotation_deg', "
                                          r"'scale', 'x_mm', 'y_mm'\]"):
        VirtualSubject.create(_config(pose={"x_mm": 10.0, "y_mm": 9.0, "rot": 30.0}), model=model)
    with pytest.raises(ConfigError, match=r"<config> \[array.pose\]: 'rotation_deg' must be <= 360"):
        VirtualSubject.create(_config(pose={"x_mm": 10.0, "y_mm": 9.0, "rotation_deg": 1e300}), model=model)


def test_subject_make_refuses_to_replace_a_subject_of_another_configuration_without_force(tmp_path, capsys):
    folder = tmp_path / "configs"
    folder.mkdir()
    layout = folder / "my_array.csv"
    layout.write_text("electrode_id,x_mm,y_mm\n"
                      + "".join(f"e{k},{0.4 * (k % 2)},{0.4 * (k // 2)}\n" for k in range(4)))
    config = folder / "subject.toml"
    text = ('[subject]\nmodel = "stimsim-topo-s2"\nseed = 4\n[array]\nlayout = "my_array.csv"\n'
            '[recording]\nrepeats = 2\n[[stimuli]]\nsource = "lfw_subset"\n')
    config.write_text(text)
    out = tmp_path / "subject"
    assert main(["subject", "make", str(config), "--out", str(out), "--no-progress"]) == 0
    config.write_text(text + "# the same subject, commented\n")  # the same configuration: made again
    assert main(["subject", "make", str(config), "--out", str(out), "--no-progress"]) == 0
    truth = (out / "truth.json").read_bytes()
    capsys.readouterr()
    config.write_text(text.replace("seed = 4", "seed = 5"))
    assert main(["subject", "make", str(config), "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"stimsim: error: output directory {out} holds a virtual subject made from "
                                       "another configuration (changed since: subject.seed (4 → 5)); give a new --out "
                                       "directory, or --force to replace it (its truth.json and recordings are "
                                       "overwritten)\n")
    config.write_text(text)
    layout.write_text(layout.read_text().replace("e3,0.4,0.4", "e3,0.8,0.4"))  # the map edited
    assert main(["subject", "make", str(config), "--out", str(out), "--no-progress"]) == 2
    assert "changed since: the layout file my_array.csv)" in capsys.readouterr().err
    assert (out / "truth.json").read_bytes() == truth and not (out / ".stimsim.lock").exists()
    assert main(["subject", "make", str(config), "--out", str(out), "--no-progress", "--force"]) == 0
    assert json.loads((out / "truth.json").read_text())["layout"] != json.loads(truth)["layout"]
    (out / "subject.toml").write_text("[subject\n")  # the saved configuration damaged: says what --force does
    capsys.readouterr()
    assert main(["subject", "make", str(config), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stimsim: error: output directory {out} holds a virtual subject whose saved configuration "
                          "cannot be read (invalid TOML") and f"{out / 'subject.toml'}); give a new --out" in err
    assert main(["subject", "make", str(config), "--out", str(out), "--no-progress", "--force"]) == 0


def test_saving_a_subject_removes_the_temporary_folder_a_killed_save_left(model, tmp_path):
    left = tmp_path / ".subject.staging.tmpk1ll3d"  # a save killed (kill -9) while it wrote the subject's files
    left.mkdir()
    (left / "recordings.nc").write_bytes(b"\0" * 1000)
    other = tmp_path / ".other.staging.tmpk1ll3d"  # another directory's save, still running
    other.mkdir()
    config = _config()
    config["stimuli"] = [{"source": "fashion_mnist", "split": "test", "n_per_class": 1, "seed": 0}]
    VirtualSubject.create(config, model=model).save(tmp_path / "subject")
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [".other.staging.tmpk1ll3d", "subject"]


def test_a_model_directory_is_read_relative_to_the_subject_file_and_saved_in_full(tmp_path, monkeypatch):
    from stimsim.models.registry import SHIPPED_DIR

    shutil.copytree(SHIPPED_DIR / "stimsim-topo-s2", tmp_path / "models" / "mine")
    config = tmp_path / "configs" / "subject.toml"
    config.parent.mkdir()
    config.write_text('[subject]\nmodel = "../models/mine"\nseed = 3\n[array]\nlayout = "8x8"\n'
                      '[[stimuli]]\nsource = "lfw_subset"\n')
    (tmp_path / "lab" / "elsewhere").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "lab" / "elsewhere")  # where ../models/mine does not exist
    subject = VirtualSubject.from_file(config)
    saved = tomllib.loads(subject.saved_config()[0])
    assert saved["subject"]["model"] == str(tmp_path.resolve() / "models" / "mine")
    assert saved["array"] == {"layout": "8x8"} and saved["stimuli"] == [{"source": "lfw_subset"}]


@pytest.mark.parametrize("given", ["../models/mine", "beside", "~/mine"])
def test_subject_plan_and_experiment_files_read_a_model_directory_alike(tmp_path, monkeypatch, given):
    """A model directory named in a subject file, a plan's candidates or an experiment file is the same directory
    whichever of these files names it and whatever path the file is given by: relative to the file's folder (through
    a symbolic link to that folder too), a folder beside the file by its bare name, or a path from the home folder."""
    from stimsim.models.registry import SHIPPED_DIR
    from stimsim.paradigms.experiment_file import load_experiment
    from stimsim.planning.config import load_plan_config

    root = tmp_path.resolve()
    shutil.copytree(SHIPPED_DIR / "stimsim-topo-s2", root / "models" / "mine")
    shutil.copytree(root / "models" / "mine", root / "exp" / "beside")
    (root / "link").symlink_to(root / "exp", target_is_directory=True)
    monkeypatch.setenv("HOME", str(root / "models"))
    (root / "exp" / "subject.toml").write_text(f'[subject]\nmodel = "{given}"\nseed = 3\n[array]\nlayout = "8x8"\n'
                                               '[[stimuli]]\nsource = "lfw_subset"\n')
    (root / "exp" / "plan.toml").write_text(f'name = "p"\n[models]\ncandidates = ["{given}"]\n'
                                            '[subject]\nconfig = "subject.toml"\n')
    experiment = (SHIPPED_DIR.parents[1] / "experiments" / "afraz2006.toml").read_text()
    (root / "exp" / "run.toml").write_text(experiment.replace('model = "stimsim-mnv2-s0"', f'model = "{given}"'))
    expected = {"../models/mine": str(root / "models" / "mine"), "beside": str(root / "exp" / "beside"),
                "~/mine": str(root / "models" / "mine")}[given]
    monkeypatch.chdir(tmp_path)
    for folder in ("exp", "link"):
        assert VirtualSubject.from_file(f"{folder}/subject.toml").config["subject"]["model"] == expected
        assert load_plan_config(f"{folder}/plan.toml").candidates == [expected]
        assert load_experiment(f"{folder}/run.toml").model == expected


def test_a_model_in_the_home_folder_of_an_unknown_user_is_named(tmp_path):
    config = tmp_path / "subject.toml"
    config.write_text('[subject]\nmodel = "~no-such-user-of-stimsim/mine"\nseed = 3\n[array]\nlayout = "8x8"\n'
                      '[[stimuli]]\nsource = "lfw_subset"\n')
    with pytest.raises(ConfigError, match=r"subject.toml \[subject\]: 'model': model directory "
                                          r"~no-such-user-of-stimsim/mine: ~no-such-user-of-stimsim names the home "
                                          "folder of a user this machine does not know"):
        VirtualSubject.from_file(config)


def test_subject_make_refuses_the_folder_of_its_own_configuration(tmp_path, capsys):
    folder = tmp_path / "configs"  # a lab's folder: its subject file (named as a subject's is), notes
    folder.mkdir()
    text = '# our implant, as planned\n[subject]\nmodel = "stimsim-topo-s2"\nseed = 4\n[array]\nlayout = "8x8"\n'
    (folder / "subject.toml").write_text(text)
    (folder / "notes.txt").write_text("surgery notes")
    assert main(["subject", "make", str(folder / "subject.toml"), "--out", str(folder), "--no-progress"]) == 2
    assert (f"output directory {folder} holds files that are not a virtual subject (notes.txt, subject.toml)"
            in capsys.readouterr().err)
    assert sorted(entry.name for entry in folder.iterdir()) == ["notes.txt", "subject.toml"]
    assert (folder / "subject.toml").read_text() == text



def test_a_subject_save_killed_while_moving_its_files_in_is_made_again(model, tmp_path, monkeypatch):
    import stimsim.subject.virtual as virtual

    config = tmp_path / "subject.toml"
    config.write_text('[subject]\nmodel = "stimsim-topo-s2"\nseed = 4\n[array]\nlayout = "8x8"\n[recording]\n'
                      'repeats = 2\n[[stimuli]]\nsource = "lfw_subset"\n')
    out = tmp_path / "subject"
    replace = os.replace

    def killed_after_the_first_file_in(source, target):
        if os.path.dirname(target) == str(out) and any(out.iterdir()):
            raise KeyboardInterrupt  # as a kill between two moves leaves it: no clean-up ran
        replace(source, target)

    monkeypatch.setattr(virtual.os, "replace", killed_after_the_first_file_in)
    with pytest.raises(KeyboardInterrupt):
        VirtualSubject.from_file(config, model=model).save(out)
    monkeypatch.undo()
    assert [entry.name for entry in out.iterdir()] == ["truth.json"]  # recognisable as a subject's directory
    assert main(["subject", "make", str(config), "--out", str(out), "--no-progress"]) == 0
    assert {"subject.toml", "recordings.nc", "subject_files.json"} <= {entry.name for entry in out.iterdir()}


def test_subject_session_refuses_a_session_id_with_a_control_character(tmp_path, capsys):
    csv = tmp_path / "session.csv"
    for session_id in ("day1\nday2", "day\t1"):  # a CSV cell over two lines; an id no one can type back
        assert main(["subject", "session", str(tmp_path / "plan"), "--session-id", session_id, "--csv", str(csv)]) == 2
        assert capsys.readouterr().err == (f"stimsim: error: --session-id {session_id!r} holds a control character (a "
                                           "newline, a tab, ...); give an id of printable text\n")
    assert not csv.exists()


def test_subject_make_refuses_a_recording_beyond_the_memory_available_before_any_work(tmp_path, monkeypatch, capsys):
    config = tmp_path / "subject.toml"
    config.write_text('[subject]\nmodel = "stimsim-topo-s2"\nseed = 4\n[array]\nlayout = "8x8"\n[recording]\n'
                      'repeats = 1000\n[[stimuli]]\nsource = "lfw_subset"\n')
    monkeypatch.setattr("stimsim.utilities.limits.available_memory_bytes", lambda: 2**30)
    # 200 images × 1000 repeats × 64 electrodes = 12.8 million responses, over 1 GiB at 84 bytes each or more
    monkeypatch.setattr(VirtualSubject, "expected_rates_Hz", lambda *args: pytest.fail("the model ran"))
    assert main(["subject", "make", str(config), "--out", str(tmp_path / "subject"), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith(
        f"stimsim: error: {config} [recording]: recording 200 images × 1000 repeats × 64 electrodes needs about ")
    assert not (tmp_path / "subject").exists()


def test_a_saved_subject_file_quotes_keys_that_are_not_bare_so_that_it_reads_back(model, tmp_path):
    (tmp_path / "my_array.csv").write_text("electrode_id,x_mm,y_mm\n"
                                           + "".join(f"e{k},{0.4 * (k % 2)},{0.4 * (k // 2)}\n" for k in range(4)))
    config = tmp_path / "subject.toml"  # a layout file: the saved subject.toml is written anew, naming its copy
    config.write_text('[subject]\nmodel = "stimsim-topo-s2"\nseed = 3\n[array]\nlayout = "my_array.csv"\n'
                      '[[stimuli]]\nsource = "lfw_subset"\nlabels = { "lab set" = "faces", "v1.2" = "x" }\n')
    saved = tomllib.loads(VirtualSubject.from_file(config, model=model).saved_config()[0])
    assert saved["stimuli"] == [{"source": "lfw_subset", "labels": {"lab set": "faces", "v1.2": "x"}}]
    assert saved["array"] == {"layout": "my_array.csv"}

"""Recordings: NetCDF and plain-pynwb NWB files, lab names, averaging, reliability, validation."""
from datetime import datetime, timezone

import numpy as np
import pytest
import xarray as xr

from stimsim.lab.arrays import utah_array
from stimsim.lab.recordings import Recordings, load_recordings
from stimsim.utilities.errors import ConfigError, DataError, FileFormatError


def _planted(n_images=40, n_repeats=3, layout=None, seed=0, signal_sd=1.0, noise_sd=1.0):
    layout = layout or utah_array("8x8").subset(["1", "2", "3", "4", "5"])
    rng = np.random.default_rng(seed)
    signal = rng.normal(0, signal_sd, (n_images, len(layout)))
    order = rng.permutation(np.repeat(np.arange(n_images), n_repeats))
    values = signal[order] + rng.normal(0, noise_sd, (len(order), len(layout)))
    ids = np.array([f"img{i:03d}" for i in order])
    return Recordings.from_arrays(values, ids, layout, {"units": "spikes/s"}), signal, order, values


def test_per_image_is_the_mean_over_repeats():
    recordings, _, order, values = _planted()
    mean = recordings.per_image()
    assert mean.dims == ("stimulus_id", "electrode")
    for image in (0, 7, 39):
        expected = values[order == image].mean(0)
        np.testing.assert_allclose(mean.sel(stimulus_id=f"img{image:03d}").values, expected)
    assert set(recordings.repeats().values) == {3}
    assert list(mean.electrode.values) == ["1", "2", "3", "4", "5"]


def test_split_half_reliability_matches_the_spearman_brown_prediction():
    # signal variance 1, trial noise variance 1, 4 repeats → reliability of the mean = 1 / (1 + 1/4) = 0.8
    recordings, *_ = _planted(n_images=3000, n_repeats=4)
    reliability = recordings.split_half_reliability(seed=1, n_splits=5)
    np.testing.assert_allclose(reliability.values, 0.8, atol=0.03)
    noise_only, *_ = _planted(n_images=3000, n_repeats=4, signal_sd=0.0)
    assert np.all(np.abs(noise_only.split_half_reliability(seed=1, n_splits=5).values) < 0.1)


def test_reliability_needs_two_repeats_and_names_the_images():
    recordings, *_ = _planted(n_repeats=1)
    with pytest.raises(DataError, match="at least 2 repeats.*40 stimulus_id"):
        recordings.split_half_reliability()


def test_netcdf_round_trip_and_lab_names(tmp_path):
    recordings, *_ = _planted()
    path = recordings.save_netcdf(tmp_path / "rec.nc")
    back = load_recordings(path)
    np.testing.assert_allclose(back.response.values, recordings.response.values)
    np.testing.assert_allclose(back.layout.positions_mm, recordings.layout.positions_mm)
    assert back.electrode_ids == recordings.electrode_ids
    # a lab's own names: integer channel ids, 'mua' on (trial, channel), 'image' ids
    lab = xr.Dataset({"mua": (("trial", "channel"), recordings.response.values)},
                     coords={"channel": [1, 2, 3, 4, 5], "image": ("trial", recordings.response.stimulus_id.values)})
    lab.to_netcdf(tmp_path / "lab.nc", engine="h5netcdf")
    names = {"response": "mua", "presentation": "trial", "electrode": "channel", "stimulus_id": "image"}
    read = load_recordings(tmp_path / "lab.nc", names=names, layout=utah_array("8x8"))
    np.testing.assert_allclose(read.per_image().values, recordings.per_image().values)
    np.testing.assert_allclose(read.layout.positions_mm, utah_array("8x8").positions_mm[:5])
    with pytest.raises(FileFormatError, match="no variable 'response'"):
        load_recordings(tmp_path / "lab.nc", layout=utah_array("8x8"))
    with pytest.raises(ConfigError, match="no electrode positions"):
        load_recordings(tmp_path / "lab.nc", names=names)


def _write_plain_nwb(path, values, stimulus_ids, channel_names, x_um, y_um, ragged=False, position_scale=1e-3):
    """An NWB file as a lab would write it with pynwb alone, in its own names; positions are written as
    µm × ``position_scale`` (mm by default)."""
    from pynwb import NWBHDF5IO, NWBFile
    from pynwb.epoch import TimeIntervals

    nwbfile = NWBFile(session_description="passive fixation", identifier="lab-file",
                      session_start_time=datetime(2024, 5, 1, 10, tzinfo=timezone.utc))
    device = nwbfile.create_device(name="UtahArray", description="Blackrock 8x8")
    group = nwbfile.create_electrode_group(name="array_IT", description="IT array", location="IT", device=device)
    nwbfile.add_electrode_column(name="channel_name", description="channel")
    nwbfile.add_electrode_column(name="pos_x", description="x on array, mm")
    nwbfile.add_electrode_column(name="pos_y", description="y on array, mm")
    for name, x, y in zip(channel_names, x_um, y_um):
        nwbfile.add_electrode(group=group, location="IT", channel_name=name, pos_x=x * position_scale,
                              pos_y=y * position_scale)
    table = TimeIntervals(name="image_presentations", description="RSVP")
    table.add_column(name="image_name", description="image")
    table.add_column(name="mua", description="MUA 70-170 ms", index=ragged)
    for i, (image, row) in enumerate(zip(stimulus_ids, values)):
        table.add_row(start_time=0.3 * i, stop_time=0.3 * i + 0.1, image_name=image,
                      mua=list(row) if ragged else row)
    nwbfile.add_time_intervals(table)
    with NWBHDF5IO(str(path), "w") as io:
        io.write(nwbfile)


@pytest.mark.parametrize("ragged", [False, True])
def test_nwb_written_with_plain_pynwb_is_read_with_lab_names(tmp_path, ragged):
    recordings, *_ = _planted()
    path = tmp_path / "lab.nwb"
    x_um = [0.0, 400.0, 800.0, 0.0, 400.0]
    y_um = [0.0, 0.0, 0.0, 400.0, 400.0]
    _write_plain_nwb(path, recordings.response.values, recordings.response.stimulus_id.values,
                     ["e1", "e2", "e3", "e4", "e5"], x_um, y_um, ragged=ragged)
    names = {"presentation": "image_presentations", "response": "mua", "stimulus_id": "image_name",
             "electrode": "channel_name", "x_mm": "pos_x", "y_mm": "pos_y"}
    read = load_recordings(path, names=names)
    assert read.electrode_ids == ("e1", "e2", "e3", "e4", "e5")
    np.testing.assert_allclose(read.response.values, recordings.response.values)
    np.testing.assert_allclose(read.layout.positions_mm[:, 0], np.array(x_um) / 1000)
    np.testing.assert_allclose(read.layout.positions_mm[:, 1], np.array(y_um) / 1000)
    np.testing.assert_allclose(read.per_image().values, recordings.per_image().values)


def test_positions_in_micrometres_are_read_as_such_and_refused_as_mm(tmp_path):
    """A lab's electrode positions in µm: mapped onto x_um, y_um they are converted to mm; mapped onto x_mm, y_mm they
    would put a 0.4 mm pitch at 400 mm and are refused, naming the file and the columns. NetCDF coordinates x_um,
    y_um are read without names."""
    recordings, *_ = _planted()
    path = tmp_path / "lab.nwb"
    x_um = [0.0, 400.0, 800.0, 0.0, 400.0]
    y_um = [0.0, 0.0, 0.0, 400.0, 400.0]
    _write_plain_nwb(path, recordings.response.values, recordings.response.stimulus_id.values,
                     ["e1", "e2", "e3", "e4", "e5"], x_um, y_um, position_scale=1.0)
    names = {"presentation": "image_presentations", "response": "mua", "stimulus_id": "image_name",
             "electrode": "channel_name"}
    read = load_recordings(path, names={**names, "x_um": "pos_x", "y_um": "pos_y"})
    np.testing.assert_allclose(read.layout.positions_mm, np.c_[x_um, y_um] / 1000)
    with pytest.raises(FileFormatError, match=r"lab.nwb: electrodes table columns 'pos_x', 'pos_y': electrodes are "
                                              r"400 mm from their nearest neighbour .* x_um, y_um"):
        load_recordings(path, names={**names, "x_mm": "pos_x", "y_mm": "pos_y"})
    with pytest.raises(FileFormatError, match=r"lab.nwb: names: x_um named, but the file has no y_um"):
        load_recordings(path, names={**names, "x_um": "pos_x"})
    um = recordings.response.to_dataset().assign_coords(x_um=("electrode", np.array(x_um)),
                                                        y_um=("electrode", np.array(y_um)))
    um.to_netcdf(tmp_path / "um.nc", engine="h5netcdf")
    np.testing.assert_allclose(load_recordings(tmp_path / "um.nc").layout.positions_mm, np.c_[x_um, y_um] / 1000)
    both = um.assign_coords(x_mm=("electrode", np.array(x_um) / 1000), y_mm=("electrode", np.array(y_um) / 1000))
    both.to_netcdf(tmp_path / "both.nc", engine="h5netcdf")
    with pytest.raises(FileFormatError, match=r"both.nc: positions in both mm \(x_mm, y_mm\) and µm \(x_um, y_um\)"):
        load_recordings(tmp_path / "both.nc")
    read = load_recordings(tmp_path / "both.nc", names={"x_mm": "x_mm", "y_mm": "y_mm"})
    np.testing.assert_allclose(read.layout.positions_mm, np.c_[x_um, y_um] / 1000)


def test_positions_in_the_file_must_agree_with_the_layout(tmp_path):
    """With a layout, positions the file also holds must agree with it up to a move of the frame: ids 1-5 of the 8×8
    grid lie on its bottom row (0.4 mm apart), so a file placing 4 and 5 on a second row names another array, and the
    same grid in µm under x_mm is 1000 times too large."""
    recordings, *_ = _planted()
    layout = utah_array("8x8")
    row_um = [[1000 * x + 5000, 1000 * y - 300] for x, y in layout.subset(["1", "2", "3", "4", "5"]).positions_mm]
    names = {"presentation": "image_presentations", "response": "mua", "stimulus_id": "image_name",
             "electrode": "channel_name"}
    path = tmp_path / "lab.nwb"
    _write_plain_nwb(path, recordings.response.values, recordings.response.stimulus_id.values,
                     ["1", "2", "3", "4", "5"], *np.transpose(row_um), position_scale=1.0)
    read = load_recordings(path, names={**names, "x_um": "pos_x", "y_um": "pos_y"}, layout=layout)
    np.testing.assert_allclose(read.layout.positions_mm, layout.positions_mm[:5])  # the layout's frame is kept
    with pytest.raises(DataError, match=r"lab.nwb: electrodes table columns 'pos_x', 'pos_y': the electrode positions "
                                        r"in the file disagree with the array layout 'utah_8x8': electrodes '1' and "
                                        r"'5' are 1600 mm apart in the file, 1.6 mm on the layout; .*\(x_um, y_um"):
        load_recordings(path, names={**names, "x_mm": "pos_x", "y_mm": "pos_y"}, layout=layout)
    other = [[0.0, 0.0], [400.0, 0.0], [800.0, 0.0], [0.0, 400.0], [400.0, 400.0]]
    _write_plain_nwb(path, recordings.response.values, recordings.response.stimulus_id.values,
                     ["1", "2", "3", "4", "5"], *np.transpose(other))
    # the largest disagreement: 1 at (0, 0) and 5 at (0.4, 0.4) mm, √0.32 = 0.5657 mm apart, are 4 × 0.4 mm apart on
    # the grid's bottom row (1 and 4: 0.4 against 1.2 mm, a smaller disagreement)
    with pytest.raises(DataError, match=r"electrodes '1' and '5' are 0.5657 mm apart in the file, 1.6 mm on the layout"):
        load_recordings(path, names={**names, "x_mm": "pos_x", "y_mm": "pos_y"}, layout=layout)


def test_positions_that_mirror_the_layout_are_refused_and_rotated_ones_accepted(tmp_path):
    """Electrodes 1, 2 (bottom row) and 9 (second row, first column) of the 8×8 grid: with rows counted from the top
    the file's triangle is the layout's mirror image — every distance agrees, but no rotation maps one onto the other.
    Turned by 90° and moved, the same positions are the layout's own."""
    from stimsim.lab.arrays import ArrayLayout

    layout = utah_array("8x8")
    ids = ["1", "2", "9"]
    grid = layout.subset(ids).positions_mm
    turned = grid @ np.array([[0.0, 1.0], [-1.0, 0.0]]) + [3.0, -2.0]
    for name, positions in (("mirror", grid * [1.0, -1.0]), ("turned", turned)):
        recordings, *_ = _planted(layout=ArrayLayout(name, ids, positions))
        recordings.save_netcdf(tmp_path / f"{name}.nc")
    assert load_recordings(tmp_path / "turned.nc", layout=layout).electrode_ids == tuple(ids)
    with pytest.raises(DataError, match=r"mirror.nc: coordinates 'x_mm', 'y_mm': the electrode positions in the file "
                                        r"are the mirror image of the array layout 'utah_8x8'"):
        load_recordings(tmp_path / "mirror.nc", layout=layout)


def _two_array_nwb(path, values):
    """An NWB file of two arrays (pIT: p1, p2; aIT: a1, a2, a3; rows interleaved) and a presentations table of 4
    presentations whose response is ``values``."""
    from pynwb import NWBHDF5IO, NWBFile
    from pynwb.epoch import TimeIntervals

    nwbfile = NWBFile(session_description="two arrays", identifier="two",
                      session_start_time=datetime(2024, 5, 1, 10, tzinfo=timezone.utc))
    device = nwbfile.create_device(name="Utah", description="two Utah arrays")
    groups = {name: nwbfile.create_electrode_group(name=name, description=name, location="IT", device=device)
              for name in ("pIT", "aIT")}
    nwbfile.add_electrode_column(name="electrode_id", description="id")
    nwbfile.add_electrode_column(name="x_mm", description="x on its array, mm")
    nwbfile.add_electrode_column(name="y_mm", description="y on its array, mm")
    rows = [("pIT", "p1", 0.0), ("aIT", "a1", 0.0), ("pIT", "p2", 0.4), ("aIT", "a2", 0.4), ("aIT", "a3", 0.8)]
    for group, electrode_id, x in rows:
        nwbfile.add_electrode(group=groups[group], location="IT", electrode_id=electrode_id, x_mm=x, y_mm=0.0)
    table = TimeIntervals(name="presentations", description="RSVP")
    table.add_column(name="stimulus_id", description="image")
    table.add_column(name="response", description="MUA")
    for i, (image, row) in enumerate(zip(["a", "b", "a", "b"], values)):
        table.add_row(start_time=float(i), stop_time=i + 0.5, stimulus_id=image, response=row)
    nwbfile.add_time_intervals(table)
    with NWBHDF5IO(str(path), "w") as io:
        io.write(nwbfile)
    return path


def test_an_nwb_file_of_two_arrays_is_read_one_array_at_a_time(tmp_path):
    """Two ElectrodeGroups (arrays), each with positions in its own frame: merged they would be registered as one
    rigid array, so the file is refused unless electrode_group names one; columns of the response follow the rows."""
    values = np.arange(4 * 5, dtype=float).reshape(4, 5)  # column j = row j of the electrodes table
    path = _two_array_nwb(tmp_path / "two.nwb", values)
    with pytest.raises(FileFormatError, match=r"two.nwb: electrodes table: electrodes of 2 arrays \(ElectrodeGroups "
                                              r"'pIT' \(2 electrodes\), 'aIT' \(3 electrodes\)\); .* electrode_group"):
        load_recordings(path)
    anterior = load_recordings(path, electrode_group="aIT")
    assert anterior.electrode_ids == ("a1", "a2", "a3")
    np.testing.assert_allclose(anterior.response.values, values[:, [1, 3, 4]])
    np.testing.assert_allclose(anterior.layout.positions_mm, [[0.0, 0.0], [0.4, 0.0], [0.8, 0.0]])
    assert load_recordings(path, electrode_group="pIT").electrode_ids == ("p1", "p2")
    with pytest.raises(FileFormatError, match=r"no ElectrodeGroup 'cIT'; groups: 'pIT' \(2 electrodes\)"):
        load_recordings(path, electrode_group="cIT")


def test_a_response_of_one_array_in_a_file_of_two_says_how_such_a_file_is_read(tmp_path):
    """A lab's file with one presentations table per array (here aIT's 3 columns only): the refusal says that the
    response needs a column for every row of the electrodes table, with electrode_group choosing the array."""
    path = _two_array_nwb(tmp_path / "per_array.nwb", np.ones((4, 3)))
    with pytest.raises(FileFormatError, match=r"column 'response': shape \(4, 3\); expected \(presentations, 5 "
                                              r"electrodes of the electrodes table\); the electrodes table holds 2 "
                                              r"arrays \(ElectrodeGroups 'pIT' \(2 electrodes\), 'aIT' \(3 "
                                              r"electrodes\)\): the response needs a column for each of its rows, and electrode_group "
                                              r"chooses the array \(a table per array is not read\)$"):
        load_recordings(path, electrode_group="aIT")


def test_names_of_fields_missing_from_the_file_are_errors(tmp_path):
    """A name the lab maps must exist: an NWB electrode-id column typo must not fall back to the table's row ids
    (0..4 here, which would silently pair responses with the wrong electrodes of a numbered layout)."""
    recordings, *_ = _planted()
    path = tmp_path / "lab.nwb"
    _write_plain_nwb(path, recordings.response.values, recordings.response.stimulus_id.values,
                     ["1", "2", "3", "4", "5"], [0.0, 400.0, 800.0, 0.0, 400.0], [0.0, 0.0, 0.0, 400.0, 400.0])
    names = {"presentation": "image_presentations", "response": "mua", "stimulus_id": "image_name",
             "electrode": "channel_name"}
    assert load_recordings(path, names=names, layout=utah_array("8x8")).electrode_ids == ("1", "2", "3", "4", "5")
    with pytest.raises(FileFormatError, match=r"lab.nwb: names: electrode = 'chan_name', but the electrodes table "
                                              r"has no such column; columns: \[.*'channel_name'"):
        load_recordings(path, names={**names, "electrode": "chan_name"}, layout=utah_array("8x8"))
    with pytest.raises(FileFormatError, match=r"lab.nwb: names: x_mm = 'posx', but the electrodes table"):
        load_recordings(path, names={**names, "x_mm": "posx", "y_mm": "pos_y"}, layout=utah_array("8x8"))
    lab = xr.Dataset({"mua": (("trial", "channel"), recordings.response.values)},
                     coords={"channel": [1, 2, 3, 4, 5], "image": ("trial", recordings.response.stimulus_id.values)})
    lab.to_netcdf(tmp_path / "lab.nc", engine="h5netcdf")
    nc_names = {"response": "mua", "presentation": "trial", "electrode": "channel", "stimulus_id": "image"}
    with pytest.raises(FileFormatError, match=r"lab.nc: names: y_mm = 'py', but the file has no such variable"):
        load_recordings(tmp_path / "lab.nc", names={**nc_names, "y_mm": "py"}, layout=utah_array("8x8"))
    shown = recordings.response.stimulus_id.values
    first_row = int(np.flatnonzero(shown == "img003")[0])
    with pytest.raises(DataError, match=rf"lab.nc: coordinate 'image', row {first_row} \(0-based\): 'img003' is not in lab.csv; "
                                        r"1 unknown stimulus id\(s\): img003; the images' ids are e.g. img000, img001, "
                                        r"img002, … \(39 in all\)"):
        load_recordings(tmp_path / "lab.nc", names=nc_names, layout=utah_array("8x8"),
                        stimulus_ids=sorted(set(shown) - {"img003"}), images_source="lab.csv")
    first_row = int(np.flatnonzero(shown == "img004")[0])
    with pytest.raises(DataError, match=rf"lab.nwb: table 'image_presentations', column 'image_name', row {first_row} \(0-based\): "):
        load_recordings(path, names=names, layout=utah_array("8x8"), stimulus_ids=sorted(set(shown) - {"img004"}))


def test_numeric_ids_read_as_text_the_same_way_in_netcdf_and_nwb(tmp_path):
    """Image numbers stored as floats (as MATLAB writes them) name the images "1", "2", like whole-number electrode
    ids, so they match an image table's ids."""
    values = np.arange(12.0).reshape(6, 2)
    lab = xr.Dataset({"response": (("presentation", "electrode"), values)},
                     coords={"electrode": [1.0, 2.0], "stimulus_id": ("presentation", [1.0, 2.0, 3.0, 1.0, 2.0, 3.0])})
    lab.to_netcdf(tmp_path / "lab.nc", engine="h5netcdf")
    read = load_recordings(tmp_path / "lab.nc", layout=utah_array("8x8"), stimulus_ids=["1", "2", "3"])
    assert read.electrode_ids == ("1", "2") and read.stimulus_ids.tolist() == ["1", "2", "3"]
    np.testing.assert_allclose(read.per_image().sel(stimulus_id="2").values, [(2 + 8) / 2, (3 + 9) / 2])


def test_stimsim_nwb_round_trip(tmp_path):
    recordings, *_ = _planted()
    back = load_recordings(recordings.save_nwb(tmp_path / "rec.nwb"))
    np.testing.assert_allclose(back.response.values, recordings.response.values)
    assert back.electrode_ids == recordings.electrode_ids
    np.testing.assert_allclose(back.layout.positions_mm, recordings.layout.positions_mm)


def test_presentations_written_twice_are_refused(tmp_path):
    """An export concatenated with itself repeats every onset: its rows would pass as repeats and make every
    electrode, dead ones included, look reliable."""
    from hdmf.common import VectorData
    from pynwb import NWBHDF5IO, NWBFile
    from pynwb.epoch import TimeIntervals

    recordings, *_ = _planted()
    with NWBHDF5IO(str(recordings.save_nwb(tmp_path / "rec.nwb")), "r") as io:
        original = io.read()
        table = original.intervals["presentations"]
        n = len(table)
        copy = NWBFile(session_description="exported twice", identifier="twice",
                       session_start_time=original.session_start_time)
        group = copy.create_electrode_group(name=recordings.layout.name, description="one array", location="IT",
                                            device=copy.create_device(name="array"))
        for column in ("electrode_id", "x_mm", "y_mm"):
            copy.add_electrode_column(name=column, description=column)
        for row in original.electrodes.to_dataframe().itertuples():
            copy.add_electrode(group=group, location="IT", electrode_id=row.electrode_id, x_mm=row.x_mm, y_mm=row.y_mm)
        copy.add_time_intervals(TimeIntervals(name="presentations", description="exported twice", columns=[
            VectorData(name=name, description=table[name].description,
                       data=np.concatenate([np.asarray(table[name].data[:])] * 2))
            for name in ("start_time", "stop_time", "stimulus_id", "response")]))
    with NWBHDF5IO(str(tmp_path / "twice.nwb"), "w") as io:
        io.write(copy)
    with pytest.raises(FileFormatError, match=rf"twice.nwb: table 'presentations': {n} presentation\(s\) start at "
                                              rf"the time of another \(e.g. 0 s, rows 0, {n} 0-based\)"):
        load_recordings(tmp_path / "twice.nwb")


def test_validation_names_file_field_and_row(tmp_path):
    recordings, *_ = _planted()
    values = recordings.response.values.copy()
    values[17, 2] = np.nan
    broken = recordings.response.copy(data=values).to_dataset(name="response")
    broken.to_netcdf(tmp_path / "nan.nc", engine="h5netcdf")
    with pytest.raises(DataError, match=r"nan.nc: variable 'response', row 17 .*electrode '3'"):
        load_recordings(tmp_path / "nan.nc", layout=utah_array("8x8"))
    path = recordings.save_netcdf(tmp_path / "rec.nc")
    with pytest.raises(DataError, match=r"rec.nc: coordinate 'electrode': 5 recorded electrode\(s\) are not in"):
        load_recordings(path, layout=utah_array("8x8").subset(["10", "11"]))
    shown = recordings.response.stimulus_id.values
    known = sorted(set(shown) - {"img017"})
    first_row = int(np.flatnonzero(shown == "img017")[0])
    with pytest.raises(DataError, match=rf"rec.nc: coordinate 'stimulus_id', row {first_row} \(0-based\): 'img017' is not in images.h5"):
        load_recordings(path, stimulus_ids=known, images_source="images.h5")
    with pytest.raises(ConfigError, match="unknown field"):
        load_recordings(path, names={"resp": "x"})
    (tmp_path / "text.nwb").write_text("not hdf5")
    with pytest.raises(FileFormatError, match="not a readable NWB file"):
        load_recordings(tmp_path / "text.nwb")


def test_an_electrode_position_that_is_not_a_number_is_an_error_naming_the_electrode_and_row(tmp_path):
    recordings, *_ = _planted()
    path = tmp_path / "lab.nwb"
    _write_plain_nwb(path, recordings.response.values, recordings.response.stimulus_id.values,
                     ["e1", "e2", "e3", "e4", "e5"], [0.0, 400.0, float("nan"), 0.0, 400.0],
                     [0.0, 0.0, 0.0, 400.0, float("inf")])
    names = {"presentation": "image_presentations", "response": "mua", "stimulus_id": "image_name",
             "electrode": "channel_name", "x_mm": "pos_x", "y_mm": "pos_y"}
    with pytest.raises(FileFormatError, match=r"lab.nwb: electrodes table columns 'pos_x', 'pos_y': electrode\(s\) "
                                              r"e3, e5 \(row\(s\) 3, 5\) have no finite position"):
        load_recordings(path, names=names)



def test_text_where_a_number_belongs_is_an_error_naming_the_field_row_and_value(tmp_path):
    recordings, *_ = _planted()
    names = {"presentation": "image_presentations", "response": "mua", "stimulus_id": "image_name",
             "electrode": "channel_name", "x_mm": "pos_x", "y_mm": "pos_y"}
    text = recordings.response.values.astype(str).astype(object)
    text[4, 1] = "NA"
    _write_plain_nwb(tmp_path / "na.nwb", text, recordings.response.stimulus_id.values,
                     ["e1", "e2", "e3", "e4", "e5"], [0.0, 400.0, 800.0, 0.0, 400.0], [0.0, 0.0, 0.0, 400.0, 400.0])
    with pytest.raises(FileFormatError, match=r"na.nwb: table 'image_presentations', column 'mua', row 4, column 1 "
                                              r"\(0-based\): 'NA' is not a number"):
        load_recordings(tmp_path / "na.nwb", names=names)
    dataset = recordings.response.to_dataset(name="response").assign_coords(
        x_mm=("electrode", ["0", "0.4", "0.8", "0", "0.4 mm"]), y_mm=("electrode", [0.0, 0.0, 0.0, 0.4, 0.4]))
    dataset.to_netcdf(tmp_path / "units.nc", engine="h5netcdf")
    with pytest.raises(FileFormatError, match=r"units.nc: variable 'x_mm', row 4 \(0-based\): '0.4 mm' is not a number"):
        load_recordings(tmp_path / "units.nc")

#: A recording format from outside stimsim, in one module: NumPy archives.
NPZ_FORMAT = '''
import numpy as np

from stimsim.lab.recordings import RecordingFormat, RecordingTable


class NpzRecordings(RecordingFormat):
    suffixes = (".npz",)

    def read(self, path, names, mapped, electrode_group):
        with np.load(path) as archive:
            return RecordingTable(archive["response"].astype(float), archive["stimulus_id"].astype(str).tolist(),
                                  archive["electrode"].astype(str).tolist(),
                                  np.column_stack([archive["x_mm"], archive["y_mm"]]), {},
                                  {"response": "array 'response'", "electrode": "array 'electrode'",
                                   "stimulus_id": "array 'stimulus_id'", "positions": "arrays 'x_mm', 'y_mm'"})
'''


def test_a_recording_format_from_another_package_is_one_module(tmp_path, outside_package):
    """A format registered from outside reads like the built-in ones and gets their checks: the same recordings
    saved as NetCDF and as .npz load to the same per-image means, a NaN response is refused naming the format's
    own field and row, an electrode_group is refused for a format of one array. Declared by an installed package's
    entry point, a fresh process finds it by suffix."""
    from stimsim.lab.recordings import RECORDING_FORMATS

    package = outside_package("labrec_t")
    NpzRecordings = package.module("npz", NPZ_FORMAT).NpzRecordings

    recordings, *_ = _planted()
    arrays = {"response": recordings.response.values, "stimulus_id": recordings.response.stimulus_id.values,
              "electrode": np.asarray(recordings.electrode_ids), "x_mm": recordings.layout.positions_mm[:, 0],
              "y_mm": recordings.layout.positions_mm[:, 1]}
    np.savez(tmp_path / "rec.npz", **arrays)
    values = arrays["response"].copy()
    values[5, 1] = np.nan
    np.savez(tmp_path / "nan.npz", **{**arrays, "response": values})
    RECORDING_FORMATS.register("npz", NpzRecordings)
    try:
        back = load_recordings(tmp_path / "rec.npz")
        reference = load_recordings(recordings.save_netcdf(tmp_path / "rec.nc"))
        np.testing.assert_array_equal(back.per_image().values, reference.per_image().values)
        assert back.electrode_ids == reference.electrode_ids
        with pytest.raises(DataError, match=r"nan.npz: array 'response', row 5 .*electrode '2'"):
            load_recordings(tmp_path / "nan.npz")
        with pytest.raises(ConfigError, match=r"electrode_group = 'A' selects an NWB ElectrodeGroup; a npz file"):
            load_recordings(tmp_path / "rec.npz", electrode_group="A")
    finally:
        RECORDING_FORMATS.unregister("npz")
    with pytest.raises(FileFormatError, match=r"rec.npz: unknown recording format '.npz'; known: NWB \(\.nwb\); "
                                              r"NetCDF \(\.nc, \.nc4, \.netcdf, \.h5netcdf\)"):
        load_recordings(tmp_path / "rec.npz")

    run = package.run_installed("stimsim.recording_formats", "npz = labrec_t.npz:NpzRecordings",
                                "import sys; from stimsim.lab.recordings import load_recordings; "
                                "print(load_recordings(sys.argv[1]).response.shape)", str(tmp_path / "rec.npz"))
    assert run.returncode == 0 and run.stdout.strip() == str(recordings.response.shape), run.stderr

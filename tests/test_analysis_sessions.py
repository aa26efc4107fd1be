"""Session files in: NWB, CSV and HDF5 tables, column mappings, and every validation error."""
from datetime import datetime, timezone

import h5py
import numpy as np
import pandas as pd
import pytest

from stimsim.analysis.synthetic import planted_curves, planted_session
from stimsim.lab.sessions import (column_mapping, load_column_mapping, load_sessions, load_value_mapping,
                                  parse_column_mapping, parse_value_mapping, value_mapping)
from stimsim.utilities.errors import ConfigError, FileFormatError


@pytest.fixture
def table():
    return planted_session([0.5, -0.5, 0.0], trials_per_site=40, seed=1)


def write_csv(frame, path):
    frame.to_csv(path, index=False)
    return path


def test_planted_truth_takes_only_possible_values():
    """The planted curves are probabilities: a lapse rate outside [0, 1) would flip or overshoot them, a NaN shift
    would make every trial "low"; a planted session's stimulated trials have a current."""
    curves = planted_curves([0.0], lapse_rate=0.2)
    assert curves.min() > 0.1 and curves.max() < 0.9 and np.all(np.diff(curves, axis=-1) > 0)
    for kwargs, message in (({"lapse_rate": 2.0}, r"lapse_rate must lie in \[0, 1\)"),
                            ({"lapse_rate": -1.0}, "lapse_rate must lie"),
                            ({"n_steps": 1}, "n_steps must be an integer >= 2")):
        with pytest.raises(ValueError, match=message):
            planted_curves([0.0], **kwargs)
    with pytest.raises(ValueError, match="stim_logodds must be finite numbers, one per site"):
        planted_curves([float("nan")])
    with pytest.raises(ValueError, match=r"current_uA must be a number > 0 µA"):
        planted_session([0.5], 20, current_uA=-50)
    with pytest.raises(ValueError, match="trials_per_site must be an integer >= 2"):
        planted_session([0.5], 0)


def test_csv_round_trip_keeps_every_trial(tmp_path, table):
    loaded = load_sessions(write_csv(table, tmp_path / "s.csv"))
    assert len(loaded) == len(table)
    assert loaded["electrode"].tolist() == table["electrode"].tolist()
    assert loaded["step"].tolist() == table["step"].tolist()
    assert loaded["choice"].tolist() == table["choice"].tolist()
    assert np.array_equal(loaded["current_uA"].to_numpy(), table["current_uA"].to_numpy())
    assert loaded["row"].tolist() == list(range(1, len(table) + 1))
    assert set(loaded["session_id"]) == {"planted"}


def test_one_session_in_two_files_is_refused_saying_why(tmp_path, table):
    """Its trials would count twice; two days filled in from a plan's NWB template share its session id 'planned'."""
    for session_id, why in (("day1", "the same session given twice would count its trials twice"),
                            ("planned", "a session filled in from a plan's rig/trials.nwb keeps its session_id "
                                        "'planned': give each day's file its own session_id")):
        files = [write_csv(table.assign(session_id=session_id), tmp_path / f"{name}.csv") for name in ("a", "b")]
        with pytest.raises(FileFormatError, match=f"b.csv: session '{session_id}' of subject 'subject' is also in "
                                                  f"another file given; {why}"):
            load_sessions(files)


def test_hdf5_group_of_columns_and_compound_dataset(tmp_path, table):
    grouped = write_hdf5(table, tmp_path / "grouped.h5")
    compound = tmp_path / "compound.hdf5"
    records = np.array(list(zip(table["electrode"].astype("S"), table["stimulated_electrode"].astype("S"),
                                table["choice"].astype("S"), table["step"], table["current_uA"])),
                       dtype=[("electrode", "S8"), ("stimulated_electrode", "S8"), ("choice", "S4"),
                              ("step", "i4"), ("current_uA", "f8")])
    with h5py.File(compound, "w") as handle:
        handle["trials"] = records
    for path in (grouped, compound):
        loaded = load_sessions(path)
        assert loaded["stimulated_electrode"].tolist() == table["stimulated_electrode"].tolist()
        assert loaded["choice"].tolist() == table["choice"].tolist()
        assert loaded["step"].tolist() == table["step"].tolist()


def test_an_nwb_electrode_column_referencing_the_electrodes_table_reads_as_electrode_ids(tmp_path, table):
    """The NWB idiom for "which electrode": a DynamicTableRegion into the electrodes table; its rows read as the ids
    recordings read there (the table's label), not as nested tables."""
    from pynwb import NWBHDF5IO, NWBFile

    nwbfile = NWBFile(session_description="2AFC", identifier="region", session_id="region",
                      session_start_time=datetime(2026, 11, 30, tzinfo=timezone.utc))
    group = nwbfile.create_electrode_group("utah", description="10x10", location="IT",
                                           device=nwbfile.create_device("array"))
    labels = sorted(set(table["electrode"]), key=int)
    nwbfile.add_electrode_column("label", "electrode id")
    for label in reversed(labels):  # rows in another order than the ids
        nwbfile.add_electrode(group=group, location="IT", label=f"e{label}")
    region = {label: len(labels) - 1 - i for i, label in enumerate(labels)}
    nwbfile.add_trial_column("electrode", "site shown", table=nwbfile.electrodes)
    for name in ("stimulated_electrode", "choice"):
        nwbfile.add_trial_column(name, name)
    nwbfile.add_trial_column("step", "step")
    nwbfile.add_trial_column("current_uA", "µA")
    for row in table.itertuples():
        nwbfile.add_trial(start_time=row.start_time, stop_time=row.stop_time, electrode=region[row.electrode],
                          stimulated_electrode="sham" if row.stimulated_electrode == "sham" else f"e{row.electrode}",
                          choice=row.choice, step=int(row.step), current_uA=float(row.current_uA))
    path = tmp_path / "region.nwb"
    with NWBHDF5IO(str(path), "w") as io:
        io.write(nwbfile)
    loaded = load_sessions(path)
    assert loaded["electrode"].tolist() == [f"e{electrode}" for electrode in table["electrode"]]
    assert loaded["choice"].tolist() == table["choice"].tolist()


def write_lab_nwb(path, table, subject_id="monkey_b", session_id="2026-11-30"):
    """An NWB file written with plain pynwb and a lab's own trial column names."""
    from pynwb import NWBHDF5IO, NWBFile
    from pynwb.file import Subject

    nwbfile = NWBFile(session_description="microstimulation 2AFC", identifier=session_id,
                      session_start_time=datetime(2026, 11, 30, tzinfo=timezone.utc), session_id=session_id,
                      subject=Subject(subject_id=subject_id, species="Macaca mulatta"))
    nwbfile.add_trial_column("site", "electrode whose morph sequence is shown")
    nwbfile.add_trial_column("morph_level", "step along the sequence")
    nwbfile.add_trial_column("stim_channel", "stimulated channel or sham")
    nwbfile.add_trial_column("amplitude_uA", "current in microamperes")
    nwbfile.add_trial_column("response", "low or high")
    for row in table.itertuples():
        nwbfile.add_trial(start_time=row.start_time, stop_time=row.stop_time, site=row.electrode,
                          morph_level=int(row.step), stim_channel=row.stimulated_electrode,
                          amplitude_uA=float(row.current_uA), response=row.choice)
    with NWBHDF5IO(str(path), "w") as io:
        io.write(nwbfile)
    return path


LAB_MAPPING = {"site": "electrode", "morph_level": "step", "stim_channel": "stimulated_electrode",
               "amplitude_uA": "current_uA", "response": "choice"}


def test_plain_pynwb_file_with_lab_columns_reads_through_a_mapping(tmp_path, table):
    path = write_lab_nwb(tmp_path / "lab.nwb", table)
    with pytest.raises(FileFormatError, match="missing column"):
        load_sessions(path)
    loaded = load_sessions(path, columns=LAB_MAPPING)
    assert len(loaded) == len(table)
    assert set(loaded["subject_id"]) == {"monkey_b"} and set(loaded["session_id"]) == {"2026-11-30"}
    assert loaded["choice"].tolist() == table["choice"].tolist()
    assert np.allclose(loaded["start_time"], table["start_time"])


def test_mapping_from_command_line_text_and_toml(tmp_path):
    text = "site=electrode, morph_level=step,stim_channel=stimulated_electrode,amplitude_uA=current_uA,response=choice"
    assert parse_column_mapping(text) == LAB_MAPPING
    toml = tmp_path / "lab.toml"
    toml.write_text("[columns]\n" + "\n".join(f'{k} = "{v}"' for k, v in LAB_MAPPING.items()) + "\n")
    assert load_column_mapping(toml) == LAB_MAPPING
    assert column_mapping(str(toml)) == column_mapping(text) == LAB_MAPPING
    with pytest.raises(ConfigError, match="unknown stimsim column"):
        parse_column_mapping("site=electrode_name")
    with pytest.raises(ConfigError, match="lab_name=stimsim_name"):
        parse_column_mapping("site")
    assert parse_column_mapping("a=electrode,b=electrode") == {"a": "electrode", "b": "electrode"}  # two rigs' names


def test_a_lab_column_given_twice_on_the_command_line_is_refused():
    """The second would silently replace the first (here the sessions would then lack 'electrode')."""
    with pytest.raises(ConfigError, match=r"--columns: lab column 'site' is given twice \(onto 'electrode' and "
                                          r"'stimulated_electrode'\)"):
        parse_column_mapping("site=electrode,response=choice,site=stimulated_electrode")


def test_mapping_naming_an_absent_column_is_refused(tmp_path, table):
    with pytest.raises(FileFormatError, match=r"mapping names column\(s\) \['chan'\]"):
        load_sessions(write_csv(table, tmp_path / "s.csv"), columns={"chan": "electrode"})


def test_one_mapping_reads_files_of_different_formats(tmp_path, table):
    """An NWB file (times and subject in NWB's own fields) and a CSV export naming its times and subject
    its own way, read together with one mapping."""
    nwb = write_lab_nwb(tmp_path / "day1.nwb", table, subject_id="monkey_b", session_id="day1")
    exported = table.rename(columns={"electrode": "site", "step": "morph_level", "choice": "response",
                                     "stimulated_electrode": "stim_channel", "current_uA": "amplitude_uA",
                                     "start_time": "t0", "subject_id": "animal"})
    exported["animal"] = "monkey_c"
    exported["t0"] += 3600.0  # another session: the same trial list an hour later (the same times would be a copy)
    csv = write_csv(exported.drop(columns=["stop_time"]), tmp_path / "day2.csv")
    mapping = {**LAB_MAPPING, "t0": "start_time", "animal": "subject_id"}
    loaded = load_sessions([nwb, csv], columns=mapping)
    assert loaded.groupby("subject_id").size().to_dict() == {"monkey_b": len(table), "monkey_c": len(table)}
    for subject, later in (("monkey_b", 0.0), ("monkey_c", 3600.0)):
        mine = loaded[loaded["subject_id"] == subject]
        assert np.array_equal(mine["start_time"].to_numpy(), table["start_time"].to_numpy() + later)
        assert mine["choice"].tolist() == table["choice"].tolist()
    with pytest.raises(FileFormatError, match=r"mapping names column\(s\) \['t1'\] that no file given has"):
        load_sessions([nwb, csv], columns={**mapping, "t1": "stop_time"})


def test_mapping_onto_a_column_the_file_already_has_is_refused(tmp_path, table):
    path = write_csv(table.assign(site=table["electrode"]), tmp_path / "s.csv")
    with pytest.raises(FileFormatError, match=r"s\.csv: the column mapping renames a column onto \['electrode'\]"):
        load_sessions(path, columns={"site": "electrode"})
    both = write_csv(table.rename(columns={"electrode": "site"}).assign(channel=table["electrode"]), tmp_path / "b.csv")
    with pytest.raises(FileFormatError, match=r"b\.csv: the column mapping maps several of the file's columns "
                                              r"\(channel, site\) onto \['electrode'\]"):
        load_sessions(both, columns={"site": "electrode", "channel": "electrode"})


def test_files_from_two_rigs_name_one_column_differently(tmp_path, table):
    rig_a = write_csv(table.rename(columns={"electrode": "site"}), tmp_path / "a.csv")
    day2 = table.iloc[::-1]  # another session: the same trials in another order
    rig_b = write_csv(day2.rename(columns={"electrode": "channel"}).assign(session_id="day2"), tmp_path / "b.csv")
    loaded = load_sessions([rig_a, rig_b], columns={"site": "electrode", "channel": "electrode"})
    assert loaded["electrode"].tolist() == table["electrode"].tolist() + day2["electrode"].tolist()


def test_a_folder_given_as_a_session_file_is_named_as_one(tmp_path):
    with pytest.raises(ConfigError, match=rf"session file {tmp_path} is a folder; give the session files in it"):
        load_sessions(tmp_path)


def test_missing_columns_named(tmp_path, table):
    path = write_csv(table.drop(columns=["choice", "step"]), tmp_path / "s.csv")
    with pytest.raises(FileFormatError, match=r"s\.csv: missing column\(s\) \['step', 'choice'\]"):
        load_sessions(path)



def test_a_missing_column_named_almost_so_is_pointed_at(tmp_path, table):
    """A header cell with another case or a space around the name reads as another column; the error says which."""
    path = write_csv(table.rename(columns={"choice": "choice ", "step": "Step"}), tmp_path / "s.csv")
    with pytest.raises(FileFormatError, match=r"missing column\(s\) \['step', 'choice'\]; did you mean 'Step' for "
                                              r"'step', 'choice ' for 'choice'\?; a session table needs"):
        load_sessions(path)
    site = write_csv(table.rename(columns={"electrode": "site"}), tmp_path / "site.csv")
    with pytest.raises(FileFormatError, match=r"missing column\(s\) \['electrode'\]; a session table needs"):
        load_sessions(site)  # not 'stimulated_electrode', a column of its own


def test_unknown_electrodes_named_with_row(tmp_path, table):
    path = write_csv(table, tmp_path / "s.csv")
    assert len(load_sessions(path, electrodes=["1", "2", "3"])) == len(table)
    first_row_of_3 = int(np.flatnonzero(table["electrode"] == "3")[0]) + 1
    with pytest.raises(FileFormatError, match=rf"column 'electrode', row\(s\) {first_row_of_3}\b.*not in the plan"):
        load_sessions(path, electrodes=["1", "2"])


@pytest.mark.parametrize("name", ["current", "current_mA"])
def test_currents_without_microamperes_in_the_name_are_explained(tmp_path, table, name):
    path = write_csv(table.rename(columns={"current_uA": name}), tmp_path / "s.csv")
    with pytest.raises(FileFormatError, match=rf"column '{name}' holds a current without µA.*current_uA"):
        load_sessions(path)
    if name == "current":  # values in µA: the mapping reads them
        assert len(load_sessions(path, columns={"current": "current_uA"})) == len(table)


def test_sham_row_with_current_is_refused_whole(tmp_path, table):
    broken = table.copy()
    sham_row = int(np.flatnonzero(broken["stimulated_electrode"] == "sham")[3])
    broken.loc[sham_row, "current_uA"] = 25.0
    with pytest.raises(FileFormatError, match=rf"refused \(nothing loaded\).*'current_uA', row\(s\) {sham_row + 1}:"
                                              r" sham trial with a current > 0 µA; e\.g\. 25\.0$"):
        load_sessions(write_csv(broken, tmp_path / "s.csv"))


def write_hdf5(frame, path):
    with h5py.File(path, "w") as handle:
        group = handle.create_group("trials")
        for name in ("electrode", "stimulated_electrode", "choice"):
            group[name] = frame[name].astype(str).to_numpy().astype("S")
        group["step"] = frame["step"].to_numpy()
        group["current_uA"] = frame["current_uA"].to_numpy()
    return path


def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path, table):
    text = table.to_csv(index=False)
    header, rest = text.split("\n", 1)
    assert "current_uA" in header.split(",")
    (tmp_path / "twice.csv").write_text(header.replace("current_uA", "choice") + "\n" + rest)
    with pytest.raises(FileFormatError, match=r"twice.csv: the header names column\(s\) \['choice'\] more than once"):
        load_sessions(tmp_path / "twice.csv")


def test_an_hdf5_column_of_non_utf8_text_or_two_dimensions_is_named(tmp_path, table):
    path = write_hdf5(table, tmp_path / "bad.h5")
    with h5py.File(path, "a") as handle:
        choices = handle["trials/choice"][()]
        choices[4] = b"h\xe9gh"
        del handle["trials/choice"]
        handle["trials/choice"] = choices
    with pytest.raises(FileFormatError, match=r"bad.h5: /trials column 'choice', row 5: not UTF-8 text"):
        load_sessions(path)
    path = write_hdf5(table, tmp_path / "wide.h5")
    with h5py.File(path, "a") as handle:
        handle["trials/extra"] = np.zeros((len(table), 2))
    with pytest.raises(FileFormatError, match=rf"wide.h5: /trials columns must be 1-D \(one value per trial\); "
                                              rf"column 'extra' has shape \({len(table)}, 2\)"):
        load_sessions(path)


@pytest.mark.parametrize("suffix", [".csv", ".h5", ".nwb"])
def test_every_format_names_file_row_and_column_and_loads_nothing(tmp_path, table, suffix):
    broken = table.copy()
    sham_row = int(np.flatnonzero(broken["stimulated_electrode"] == "sham")[2])
    broken.loc[sham_row, "current_uA"] = 30.0
    broken.loc[7, "choice"] = "left"
    path = tmp_path / f"day1{suffix}"
    if suffix == ".csv":
        write_csv(broken, path)
    elif suffix == ".h5":
        write_hdf5(broken, path)
    else:
        write_lab_nwb(path, broken)
    columns = LAB_MAPPING if suffix == ".nwb" else None
    with pytest.raises(FileFormatError) as error:
        load_sessions(path, columns=columns)
    message = str(error.value)
    assert f"day1{suffix}" in message and "nothing loaded" in message
    assert f"'current_uA', row(s) {sham_row + 1}: sham trial with a current" in message
    assert "'choice', row(s) 8: choice outside the task's options" in message


def test_choice_outside_the_options(tmp_path, table):
    broken = table.copy()
    broken.loc[5, "choice"] = "left"
    with pytest.raises(FileFormatError, match=r"'choice', row\(s\) 6: choice outside the task's options"
                                              r" \['low', 'high'\] \(a lab's own codes map with --values "
                                              r"choice:CODE=low,CODE=high\); e\.g\. 'left'"):
        load_sessions(write_csv(broken, tmp_path / "s.csv"))


def test_a_trial_list_without_any_choice_is_named_as_one(tmp_path, table):
    aborted = table.astype({"choice": object})
    aborted.loc[3, "choice"] = ""
    with pytest.raises(FileFormatError, match=r"column 'choice', row\(s\) 4: empty value \(an aborted trial has no "
                                              r"choice: remove aborted trials"):
        load_sessions(write_csv(aborted, tmp_path / "aborted.csv"))
    with pytest.raises(FileFormatError, match=r"column 'choice', row\(s\) 1, 2, 3, 4, 5 \(\+\d+ more\): empty value in "
                                              r"every row: a trial list before its session"):
        load_sessions(write_csv(table.assign(choice=""), tmp_path / "trials.csv"))


def test_empty_session(tmp_path, table):
    with pytest.raises(FileFormatError, match="empty session"):
        load_sessions(write_csv(table.iloc[:0], tmp_path / "s.csv"))


def test_other_row_problems_are_all_listed(tmp_path, table):
    broken = table.astype({"step": object}).copy()
    broken.loc[0, "step"] = "2.5"
    stimulated_row = int(np.flatnonzero(broken["stimulated_electrode"] != "sham")[0])
    broken.loc[stimulated_row, "stimulated_electrode"] = "99"
    broken.loc[1, "stop_time"] = broken.loc[1, "start_time"] - 1
    with pytest.raises(FileFormatError) as error:
        load_sessions(write_csv(broken, tmp_path / "s.csv"))
    message = str(error.value)
    assert "'step', row(s) 1: step must be an integer" in message
    assert f"'stimulated_electrode', row(s) {stimulated_row + 1}: stimulated electrode differs" in message
    assert "'stop_time', row(s) 2: trial stops before it starts" in message


def test_one_broken_file_among_several_loads_nothing(tmp_path, table):
    good = write_csv(table, tmp_path / "good.csv")
    broken = table.copy()
    broken.loc[len(broken) - 1, "choice"] = "maybe"
    bad = write_csv(broken.assign(session_id="other"), tmp_path / "bad.csv")
    with pytest.raises(FileFormatError, match=r"bad\.csv"):
        load_sessions([good, bad])


def test_several_subjects_and_sessions(tmp_path):
    a = planted_session([1.0, 0.0], 20, subject_id="m1", session_id="day1", seed=1)
    b = planted_session([1.0, 0.0], 20, subject_id="m2", session_id="day1", seed=2)
    loaded = load_sessions([write_csv(a, tmp_path / "a.csv"), write_csv(b, tmp_path / "b.csv")])
    assert loaded.groupby("subject_id").size().to_dict() == {"m1": 40, "m2": 40}
    with pytest.raises(FileFormatError, match="also in another file"):
        load_sessions([tmp_path / "a.csv", write_csv(a, tmp_path / "a_copy.csv")])


def test_the_same_trials_in_two_files_are_refused(tmp_path, table):
    table = table.drop(columns=["session_id", "correct"])  # each file's session is then named by its file
    path = write_csv(table, tmp_path / "day1.csv")
    copy = write_csv(table, tmp_path / "day1_backup.csv")  # another file name, so another default session id
    with pytest.raises(FileFormatError, match=r"day1_backup\.csv: holds the same 120 trials, in the same order, as "
                                              r".*day1\.csv .*counted twice"):
        load_sessions([path, copy])
    one_choice_changed = table.assign(choice=table["choice"].where(table.index != 7, "low" if table["choice"][7] == "high"
                                                                   else "high"))
    assert len(load_sessions([path, write_csv(one_choice_changed, tmp_path / "day2.csv")])) == 2 * len(table)


def test_one_session_exported_with_fewer_columns_is_refused_as_a_copy(tmp_path, table):
    """An NWB export without the CSV's image ids (or start times) still holds the same trials."""
    path = write_csv(table.drop(columns=["session_id"]), tmp_path / "day1.csv")
    nwb = write_lab_nwb(tmp_path / "day1.nwb", table)  # the lab's own columns, no stimulus_id
    with pytest.raises(FileFormatError, match=r"day1\.nwb: holds the same 120 trials, in the same order, as "
                                              r".*day1\.csv .*counted twice"):
        load_sessions([path, nwb], columns=LAB_MAPPING)
    later = table.drop(columns=["session_id", "stimulus_id"]).assign(start_time=table["start_time"] + 3600,
                                                                     stop_time=table["stop_time"] + 3600)
    later = write_csv(later, tmp_path / "day2.csv")  # the same trials and choices at other times: another session
    assert len(load_sessions([path, later])) == 2 * len(table)


def test_a_rig_condition_column_must_agree_with_the_stimulated_electrode(tmp_path, table):
    condition = np.where(table["stimulated_electrode"] == "sham", "sham", "stimulation")
    assert len(load_sessions(write_csv(table.assign(condition=condition), tmp_path / "rig.csv"))) == len(table)
    swapped = condition.copy()
    swapped[[2, 3]] = np.where(condition[[2, 3]] == "sham", "stimulation", "sham")
    with pytest.raises(FileFormatError, match=r"column 'condition', row\(s\) 3, 4: condition disagrees with "
                                              r"stimulated_electrode"):
        load_sessions(write_csv(table.assign(condition=swapped), tmp_path / "swapped.csv"))
    # a lab's own 'condition' column (here: the task's) says something else and is left alone
    assert len(load_sessions(write_csv(table.assign(condition="faces"), tmp_path / "task.csv"))) == len(table)


def test_a_csv_cut_off_while_written_is_refused(tmp_path, table):
    text = write_csv(table, tmp_path / "whole.csv").read_text()
    cut = tmp_path / "cut.csv"
    cut.write_text(text[:text.rstrip("\n").rfind(",")])  # the last line loses its last value and its line end
    with pytest.raises(FileFormatError, match=rf"the last line \(row {len(table)}\) holds {table.shape[1] - 1} of the "
                                              rf"header's {table.shape[1]} values and no line end"):
        load_sessions(cut)
    no_line_end = tmp_path / "no_line_end.csv"
    no_line_end.write_text(text.rstrip("\n"))  # complete, only without the last line end
    assert len(load_sessions(no_line_end)) == len(table)


def test_an_empty_subject_or_session_cell_among_named_ones_is_refused(tmp_path, table):
    """A blank cell would make its trial another subject's ('subject') or session's (the file name): a site of one
    trial. A column blank throughout reads as the defaults."""
    named = table.assign(subject_id="m1")
    named.loc[3, "subject_id"] = ""
    named.loc[[5, 8], "session_id"] = ""
    with pytest.raises(FileFormatError) as refused:
        load_sessions(write_csv(named, tmp_path / "s.csv"))
    message = str(refused.value)
    assert ("column 'subject_id', row(s) 4: empty value where the other rows name a subject (the trial would count "
            "as another subject's, 'subject'") in message
    assert "column 'session_id', row(s) 6, 9: empty value where the other rows name a session" in message
    loaded = load_sessions(write_csv(table.assign(subject_id="", session_id=""), tmp_path / "day1.csv"))
    assert set(loaded["subject_id"]) == {"subject"} and set(loaded["session_id"]) == {"day1"}


def test_protocol_columns_hold_numbers_or_nothing(tmp_path, table):
    """A stimulator setting written with its unit or mistyped would read as missing (NaN); sham rows may leave it
    empty or NaN."""
    stimulated = table["stimulated_electrode"] != "sham"
    given = table.assign(frequency_Hz=np.where(stimulated, "200", ""), train_ms=np.where(stimulated, "50", "NaN"))
    loaded = load_sessions(write_csv(given, tmp_path / "s.csv"))
    assert np.array_equal(loaded["frequency_Hz"].to_numpy(), np.where(stimulated, 200.0, np.nan), equal_nan=True)
    assert np.array_equal(loaded["train_ms"].to_numpy(), np.where(stimulated, 50.0, np.nan), equal_nan=True)
    rows = np.flatnonzero(stimulated) + 1
    given.loc[rows[0] - 1, "frequency_Hz"] = "200 Hz"
    given.loc[rows[1] - 1, "train_ms"] = "inf"
    with pytest.raises(FileFormatError) as refused:
        load_sessions(write_csv(given, tmp_path / "s.csv"))
    assert (f"column 'frequency_Hz', row(s) {rows[0]}: must be a number (Hz), or empty where a trial gives none (sham "
            "trials); e.g. '200 Hz'") in str(refused.value)
    assert f"column 'train_ms', row(s) {rows[1]}: must be a number (ms)" in str(refused.value)


def test_a_file_given_twice_is_refused(tmp_path, table):
    path = write_csv(table, tmp_path / "s.csv")
    with pytest.raises(ConfigError, match="given twice"):
        load_sessions([path, tmp_path / "." / "s.csv"])


def test_duplicate_trial_rows_are_refused(tmp_path, table):
    doubled = pd.concat([table, table.iloc[[4, 9]]], ignore_index=True)
    n = len(table)
    with pytest.raises(FileFormatError, match=rf"'start_time', row\(s\) {n + 1}, {n + 2}: a trial of the same session"
                                              rf" starts at the same time as an earlier row"):
        load_sessions(write_csv(doubled, tmp_path / "s.csv"))
    other_session = pd.concat([table, table.iloc[[4]].assign(session_id="day2")], ignore_index=True)
    assert len(load_sessions(write_csv(other_session, tmp_path / "two.csv"))) == n + 1


def test_a_session_whose_trials_all_start_at_one_time_is_named_as_one_without_trial_times(tmp_path, table):
    """An NWB trials table must have start times; a file that writes one for every trial is not 'given twice'."""
    n = len(table)
    with pytest.raises(FileFormatError, match=rf"column 'start_time', row\(s\) 2, 3, 4, 5, 6 \(\+{n - 6} more\): every "
                                              r"trial of the session starts at the same time: the file gives no trial "
                                              r"times; give each trial its own start time \(s\); e.g. 0.0$"):
        load_sessions(write_csv(table.assign(start_time=0.0, stop_time=0.0), tmp_path / "untimed.csv"))


def test_trials_of_a_rig_trial_list_given_twice_are_refused(tmp_path, table):
    """The rig package's trial list numbers every trial once (``trial``, with ``block``): a file without start times
    whose rows were written twice would count those trials twice."""
    rig = table.drop(columns=["start_time", "stop_time"]).assign(trial=np.arange(1, len(table) + 1),
                                                                  block=np.arange(len(table)) // 6 + 1)
    n = len(rig)
    assert len(load_sessions(write_csv(rig, tmp_path / "rig.csv"))) == n
    doubled = pd.concat([rig, rig.iloc[[4, 9]]], ignore_index=True)
    with pytest.raises(FileFormatError, match=rf"column 'trial', row\(s\) {n + 1}, {n + 2}: a trial number of the same "
                                              r"session and block as an earlier row \(the trial given twice, or two "
                                              r"runs of the trial list in one file without a session_id column "
                                              r"telling them apart\?\); e.g. '5'"):
        load_sessions(write_csv(doubled, tmp_path / "doubled.csv"))
    # trials numbered within each block (a lab's own numbering) repeat across blocks only
    per_block = rig.assign(trial=np.arange(len(rig)) % 6 + 1)
    assert len(load_sessions(write_csv(per_block, tmp_path / "per_block.csv"))) == n
    two_days = pd.concat([rig.assign(session_id="day1"), rig.assign(session_id="day2")], ignore_index=True)
    assert len(load_sessions(write_csv(two_days, tmp_path / "two_days.csv"))) == 2 * n


def test_sessions_at_step_0_only_are_refused(tmp_path, table):
    with pytest.raises(FileFormatError, match=r"s\.csv: every trial is at step 0"):
        load_sessions(write_csv(table.assign(step=0).drop(columns="stimulus_id"), tmp_path / "s.csv"))


def test_sessions_without_sham_or_without_stimulation_are_refused(tmp_path, table):
    sham_only = table[table["stimulated_electrode"] == "sham"]
    with pytest.raises(FileFormatError, match=r"s\.csv: column 'stimulated_electrode': no stimulated trial"):
        load_sessions(write_csv(sham_only, tmp_path / "s.csv"))
    with pytest.raises(FileFormatError, match=r"t\.csv: column 'stimulated_electrode': no sham trial"):
        load_sessions(write_csv(table[table["stimulated_electrode"] != "sham"], tmp_path / "t.csv"))


def test_steps_counted_from_1_are_refused(tmp_path, table):
    with pytest.raises(FileFormatError, match=r"s\.csv: column 'step': no trial at step 0 \(steps found 1\.\.7\)"):
        load_sessions(write_csv(table.assign(step=table["step"] + 1).drop(columns="stimulus_id"), tmp_path / "s.csv"))


def test_steps_with_a_gap_no_trial_is_at_are_refused_without_a_plan(tmp_path, table):
    """Without a plan the curves span 0 .. the last step: a mistyped 60 for 6 would empty steps 7..59 at every site (and
    size the counts by it), a step no trial is at would leave every site without a ΔAUC."""
    typo = table.drop(columns=["stimulus_id", "correct"])
    row = int(np.flatnonzero(typo["step"] == 6)[0])
    typo.loc[row, "step"] = 60
    with pytest.raises(FileFormatError, match=rf"column 'step', row\(s\) {row + 1}: beyond steps 7..59, at which no "
                                              r"trial of any site is: every site's curve would have an empty step"):
        load_sessions(write_csv(typo, tmp_path / "typo.csv"))
    unrun = table[table["step"] != 3]
    rows = ", ".join(str(r) for r in (np.flatnonzero(unrun["step"] > 3) + 1)[:5])
    with pytest.raises(FileFormatError, match=rf"row\(s\) {rows} \(\+\d+ more\): beyond step 3, at which no trial"):
        load_sessions(write_csv(unrun, tmp_path / "unrun.csv"))
    huge = table.astype({"step": object})
    huge.loc[row, "step"] = "1e300"  # an integer-valued float beyond any exact integer
    with pytest.raises(FileFormatError, match=rf"column 'step', row\(s\) {row + 1}: step must be an integer >= 0; "
                                              r"e.g. '1e300'"):
        load_sessions(write_csv(huge, tmp_path / "huge.csv"))
    huge = table.drop(columns=["stimulus_id"]).astype({"sequence": object})
    huge.loc[row, "sequence"] = "1e300"  # had wrapped round to a negative sequence, within a plan's range
    with pytest.raises(FileFormatError, match=rf"column 'sequence', row\(s\) {row + 1}: sequence must be an integer "):
        load_sessions(write_csv(huge, tmp_path / "huge.csv"), plan_sequences=("plan.nc", 1, 7))


def test_unreadable_csv_is_one_line(tmp_path):
    (tmp_path / "s.csv").write_text("electrode,step\n1,0\n1,2,3\n")
    with pytest.raises(FileFormatError, match="not a readable CSV table .*; stimsim reads values separated by "
                                              "commas, with '.' as the decimal mark") as error:
        load_sessions(tmp_path / "s.csv")
    assert "\n" not in str(error.value)
    (tmp_path / "semicolons.csv").write_text("electrode;step;stimulated_electrode;current_uA;choice\n1;0;sham;0;low\n")
    with pytest.raises(FileFormatError, match="the header holds ';' or tabs: a CSV table's values are separated by "
                                              "commas"):
        load_sessions(tmp_path / "semicolons.csv")


def test_csv_rows_with_more_values_than_the_header_are_refused_saying_why(tmp_path, table):
    """pandas would make the values beyond the header an index and shift every column: a decimal comma, or a
    separator at the end of each line, read as columns moved one place."""
    text = write_csv(table[["electrode", "step", "stimulated_electrode", "current_uA", "choice"]],
                     tmp_path / "whole.csv").read_text()
    header, *rows = text.splitlines()
    n = len(rows)
    for name, lines in (("comma.csv", [row.replace(".", ",") for row in rows]),  # 50.0 written 50,0
                        ("trailing.csv", [row + "," for row in rows])):
        (tmp_path / name).write_text("\n".join([header, *lines]) + "\n")
        with pytest.raises(FileFormatError, match=rf"{name}: row\(s\) 1, 2, 3, 4, 5 \(\+{n - 5} more\) hold more "
                                                  r"values than the header's 5 columns \(row 1: 6\): a decimal comma"):
            load_sessions(tmp_path / name)


def test_a_quoted_decimal_comma_is_named_as_one(tmp_path, table):
    """A spreadsheet in a locale with a decimal comma quotes "50,0" in its CSV export: one column, read as text."""
    text = write_csv(table[["electrode", "step", "stimulated_electrode", "current_uA", "choice"]],
                     tmp_path / "whole.csv").read_text()
    (tmp_path / "quoted.csv").write_text(text.replace(",50.0,", ',"50,0",'))
    with pytest.raises(FileFormatError, match=r"column 'current_uA', row\(s\) .*: current must be a number >= 0 µA .*; "
                                              r"e.g. '50,0' \(a decimal comma: write 50.0\)"):
        load_sessions(tmp_path / "quoted.csv")


def test_a_csv_table_in_another_encoding_than_utf8_is_refused_saying_how_to_save_it(tmp_path, table):
    text = table.rename(columns={"current_uA": "current_µA"}).to_csv(index=False)
    for encoding in ("cp1252", "utf-16"):  # Excel's 'CSV' on Windows, and its 'Unicode text'
        (tmp_path / f"{encoding}.csv").write_text(text, encoding=encoding)
        with pytest.raises(FileFormatError, match=rf"{encoding}.csv: not UTF-8 text \(invalid start byte: .+\); stimsim "
                                                  r"reads CSV tables in UTF-8: save the table as UTF-8"):
            load_sessions(tmp_path / f"{encoding}.csv")


def test_csv_without_header_is_an_empty_session(tmp_path):
    (tmp_path / "s.csv").write_text("\n")
    with pytest.raises(FileFormatError, match=r"s\.csv: empty session"):
        load_sessions(tmp_path / "s.csv")


def test_hdf5_file_that_is_not_nwb_is_refused(tmp_path, table):
    with pytest.raises(FileFormatError, match=r"s\.nwb: not a readable NWB file"):
        load_sessions(write_hdf5(table, tmp_path / "s.nwb"))


def test_an_nwb_trials_table_whose_columns_differ_in_length_is_refused(tmp_path, table):
    import h5py

    path = write_lab_nwb(tmp_path / "short.nwb", table)
    with h5py.File(path, "r+") as handle:
        ids, attributes = handle["intervals/trials/id"][:-10], dict(handle["intervals/trials/id"].attrs)
        del handle["intervals/trials/id"]
        handle["intervals/trials/id"] = ids
        handle["intervals/trials/id"].attrs.update(attributes)
    with pytest.raises(FileFormatError, match=r"short\.nwb: not a readable NWB file \(ConstructError: Could not "
                                              r"construct TimeIntervals object due to: Must provide same number of ids "
                                              r"as length of columns\)$"):
        load_sessions(path)


def test_unknown_format_and_missing_file(tmp_path):
    (tmp_path / "s.xlsx").write_text("x")
    with pytest.raises(FileFormatError, match="unknown session format"):
        load_sessions(tmp_path / "s.xlsx")
    with pytest.raises(FileNotFoundError):
        load_sessions(tmp_path / "absent.csv")


def write_coded_nwb(path, table, sham_channel=-1):
    """Plain pynwb, a lab's own names and codes: integer channels with -1 on sham trials, choices 1 (low) / 2 (high)."""
    from pynwb import NWBHDF5IO, NWBFile
    from pynwb.file import Subject

    nwbfile = NWBFile(session_description="2AFC", identifier="day3", session_id="day3",
                      session_start_time=datetime(2026, 12, 1, tzinfo=timezone.utc),
                      subject=Subject(subject_id="monkey_b", species="Macaca mulatta"))
    for name, meaning in (("site", "channel whose sequence is shown"), ("morph_level", "step"),
                          ("stim_channel", "stimulated channel, -1 on sham"), ("amplitude_uA", "µA"),
                          ("response", "1 = low, 2 = high")):
        nwbfile.add_trial_column(name, meaning)
    for row in table.itertuples():
        nwbfile.add_trial(start_time=row.start_time, stop_time=row.stop_time, site=int(row.electrode),
                          morph_level=int(row.step), amplitude_uA=float(row.current_uA),
                          stim_channel=sham_channel if row.stimulated_electrode == "sham" else int(row.electrode),
                          response=1 if row.choice == "low" else 2)
    with NWBHDF5IO(str(path), "w") as io:
        io.write(nwbfile)
    return path


def test_lab_value_codes_in_a_plain_pynwb_file_read_through_a_toml_mapping(tmp_path, table):
    path = write_coded_nwb(tmp_path / "coded.nwb", table)
    with pytest.raises(FileFormatError, match=r"choice outside the task's options .*--values choice:CODE=low"):
        load_sessions(path, columns=LAB_MAPPING)
    toml = tmp_path / "lab.toml"
    toml.write_text("[columns]\n" + "".join(f'{k} = "{v}"\n' for k, v in LAB_MAPPING.items())
                    + '[values.choice]\n1 = "low"\n2 = "high"\n[values.stimulated_electrode]\n-1 = "sham"\n')
    values = load_value_mapping(toml)
    assert values == {"choice": {"1": "low", "2": "high"}, "stimulated_electrode": {"-1": "sham"}}
    assert load_column_mapping(toml) == LAB_MAPPING
    loaded = load_sessions(path, columns=load_column_mapping(toml), values=values)
    for column in ("electrode", "stimulated_electrode", "choice"):
        assert loaded[column].tolist() == table[column].tolist(), column
    assert np.array_equal(loaded["current_uA"].to_numpy(), table["current_uA"].to_numpy())


def test_sham_marked_by_a_current_code_becomes_a_sham_trial_at_zero_current(tmp_path, table):
    coded = table.assign(stimulated_electrode=table["electrode"],
                         current_uA=np.where(table["stimulated_electrode"] == "sham", -1, table["current_uA"]))
    path = write_csv(coded, tmp_path / "s.csv")
    with pytest.raises(FileFormatError, match=r"current must be a number >= 0 µA .*--values current_uA:CODE=sham"):
        load_sessions(path)
    loaded = load_sessions(path, values=parse_value_mapping("current_uA:-1=sham"))
    assert loaded["stimulated_electrode"].tolist() == table["stimulated_electrode"].tolist()
    assert np.array_equal(loaded["current_uA"].to_numpy(), table["current_uA"].to_numpy())
    blank = coded.assign(current_uA=coded["current_uA"].where(coded["current_uA"] >= 0))  # sham rows left empty
    loaded = load_sessions(write_csv(blank, tmp_path / "blank.csv"), values=parse_value_mapping("current_uA:nan=sham"))
    assert loaded["stimulated_electrode"].tolist() == table["stimulated_electrode"].tolist()
    assert np.array_equal(loaded["current_uA"].to_numpy(), table["current_uA"].to_numpy())
    # "none" in the electrode column, any case, is the other usual sham marker
    named = table.assign(stimulated_electrode=table["stimulated_electrode"].replace("sham", "None"))
    loaded = load_sessions(write_csv(named, tmp_path / "n.csv"), values={"stimulated_electrode": {"none": "sham"}})
    assert loaded["stimulated_electrode"].tolist() == table["stimulated_electrode"].tolist()


def test_a_sham_code_that_is_also_an_electrode_id_is_refused(tmp_path, table):
    """Channels numbered from 1 and sham coded as 1 (or 1.0): electrode 1's stimulated trials would read as sham."""
    coded = table.assign(stimulated_electrode=table["stimulated_electrode"].replace("sham", "1.0"))
    rows = ", ".join(str(row) for row in (np.flatnonzero(table["electrode"] == "1") + 1)[:5])
    with pytest.raises(FileFormatError, match=rf"column 'stimulated_electrode', row\(s\) {rows} \(\+\d+ more\): the "
                                              r"sham code '1' is also the row's electrode id: a trial stimulating this "
                                              r"electrode cannot be told from a sham trial"):
        load_sessions(write_csv(coded, tmp_path / "s.csv"), values=parse_value_mapping("stimulated_electrode:1=sham"))


def test_sham_trials_with_an_empty_stimulated_channel_map_with_the_nan_code(tmp_path, table):
    """A rig storing the stimulated channel as a number leaves it NaN on sham trials (NWB float column)."""
    channel = pd.to_numeric(table["stimulated_electrode"], errors="coerce")  # sham: NaN
    path = write_lab_nwb(tmp_path / "s.nwb", table.assign(stimulated_electrode=channel))
    with pytest.raises(FileFormatError, match=r"column 'stimulated_electrode', row\(s\) [\d, ]+.*: empty value \(sham "
                                              r"trials left empty map with --values stimulated_electrode:nan=sham\)"):
        load_sessions(path, columns=LAB_MAPPING)
    loaded = load_sessions(path, columns=LAB_MAPPING, values=parse_value_mapping("stimulated_electrode:nan=sham"))
    assert loaded["stimulated_electrode"].tolist() == table["stimulated_electrode"].tolist()


def test_unknown_value_codes_are_named_with_file_column_rows_and_the_codes_allowed(tmp_path, table):
    coded = table.assign(choice=np.where(table["choice"] == "low", "0", "1"))
    coded.loc[[4, 9], "choice"] = "2"
    path = write_csv(coded, tmp_path / "s.csv")
    with pytest.raises(FileFormatError) as refused:
        load_sessions(path, values=parse_value_mapping("choice:0=low,1=high"))
    message = str(refused.value)
    assert message.startswith(f"{path}: refused (nothing loaded)")
    assert "column 'choice', row(s) 5, 10: code not in the value mapping of 'choice' (allowed codes: 0, 1); " \
           "e.g. '2'" in message
    assert "outside the task's options" not in message  # one problem per row, not two


def test_numeric_value_codes_compare_as_numbers_and_text_codes_as_text(tmp_path, table):
    """A rig writing its codes as floats ("1.0", "-1.0") matches a mapping of integers (and the reverse); 'correct' of
    1.0 / 0.0 is true / false; codes equal as numbers given twice are refused as ambiguous."""
    is_high, is_sham = table["choice"] == "high", table["stimulated_electrode"] == "sham"
    floats = table.assign(choice=np.where(is_high, "1.0", "0.0"), correct=table["correct"].map({True: "1.0",
                                                                                                False: "0.0"}),
                          stimulated_electrode=table["stimulated_electrode"].where(~is_sham, "-1.0"))
    path = write_csv(floats, tmp_path / "floats.csv")
    for spec in ("choice:0=low,1=high", "choice:0.0=low,1.00=high", "choice:00=low,1e0=high"):
        loaded = load_sessions(path, values={**parse_value_mapping(spec),
                                             **parse_value_mapping("stimulated_electrode:-1=sham")})
        assert loaded["choice"].tolist() == table["choice"].tolist(), spec
        assert loaded["stimulated_electrode"].tolist() == table["stimulated_electrode"].tolist(), spec
        assert loaded["correct"].tolist() == table["correct"].tolist(), spec
    integers = table.assign(choice=np.where(is_high, "1", "0"))
    loaded = load_sessions(write_csv(integers, tmp_path / "integers.csv"),
                           values=parse_value_mapping("choice:0.0=low,1.0=high"))
    assert loaded["choice"].tolist() == table["choice"].tolist()
    lettered = table.assign(choice=np.where(is_high, "H", "L"))  # text compares as text, case ignored
    loaded = load_sessions(write_csv(lettered, tmp_path / "letters.csv"),
                           values=parse_value_mapping("choice:l=low,h=high"))
    assert loaded["choice"].tolist() == table["choice"].tolist()
    # compared exactly: a tiny or huge number is neither 0 nor an error
    assert parse_value_mapping("choice:0=low,1e-9999999=high,1e9999999=high")["choice"] == {
        "0": "low", "1e-9999999": "high", "1e9999999": "high"}
    for spec in ("choice:1=low,1.0=high", "choice:1=high,01=high", "stimulated_electrode:-1=sham,-1.0=sham"):
        with pytest.raises(ConfigError, match=r"is given twice \(as '.+'; case is ignored and numbers compare as "
                                              r"numbers"):
            parse_value_mapping(spec)
    toml = tmp_path / "lab.toml"
    toml.write_text('[values.choice]\n0.0 = "low"\n1.0 = "high"\n')  # TOML: tables 0 and 1, not codes
    with pytest.raises(ConfigError, match=r"code '0' holds a table \{'0': 'low'\}, not a value; in a TOML file "
                                          r"quote a code with a '.'"):
        load_value_mapping(toml)


def test_electrode_ids_written_as_floats_read_as_in_an_nwb_file(tmp_path, table):
    """A channel column with NaN on sham trials is a float column: its CSV export writes '12.0' where the electrode
    column says '12'; the NWB file of the same table reads as id '12'."""
    channel = pd.to_numeric(table["stimulated_electrode"], errors="coerce")  # sham: NaN
    path = write_csv(table.assign(stimulated_electrode=channel, electrode=table["electrode"] + ".00"),
                     tmp_path / "s.csv")
    assert pd.read_csv(path, dtype=str)["stimulated_electrode"].dropna().str.endswith(".0").all()
    for read in (path, write_lab_nwb(tmp_path / "s.nwb", table.assign(stimulated_electrode=channel))):
        loaded = load_sessions(read, columns=LAB_MAPPING if read.suffix == ".nwb" else None,
                               values=parse_value_mapping("stimulated_electrode:nan=sham"))
        assert loaded["electrode"].tolist() == table["electrode"].tolist()
        assert loaded["stimulated_electrode"].tolist() == table["stimulated_electrode"].tolist()


def test_a_value_code_no_file_holds_is_refused(tmp_path, table):
    coded = table.assign(choice=np.where(table["choice"] == "low", "0", "1"))
    reordered = coded.iloc[::-1]  # each further session: the same trials in another order
    paths = [write_csv(coded, tmp_path / "a.csv"), write_csv(reordered.assign(session_id="b"), tmp_path / "b.csv")]
    with pytest.raises(FileFormatError, match=r"the value mapping of column 'choice' names code\(s\) \['-1'\] that no "
                                              r"file given holds in that column \(its values: '0', '1'\)"):
        load_sessions(paths, values=parse_value_mapping("choice:0=low,1=high,-1=low"))
    # a code held by one of the files read together is fine (two rigs, one mapping)
    rig_b = coded.iloc[np.r_[1:len(coded), 0]].assign(session_id="c")
    paths.append(write_csv(rig_b.assign(choice=rig_b["choice"].replace({"0": "L", "1": "H"})), tmp_path / "c.csv"))
    loaded = load_sessions(paths, values=parse_value_mapping("choice:0=low,1=high,l=low,h=high"))
    choices = table["choice"].tolist()
    assert loaded["choice"].tolist() == choices + choices[::-1] + choices[1:] + choices[:1]


def test_value_mappings_are_checked_before_any_file_is_read():
    assert parse_value_mapping("choice: 0=low, 1=HIGH") == {"choice": {"0": "low", "1": "high"}}
    for text, problem in (("electrode:-1=sham", "no value mapping for column 'electrode'"),
                          ("choice:0=low,1=up", "allowed values: low, high"),
                          ("stimulated_electrode:-1=none", "allowed values: sham"),
                          ("current_uA:none=sham", "is not a number"),
                          ("choice:low=high,high=low", "would swap meanings"),
                          ("choice:0=low,0=high", "given twice"),
                          ("choice:A=low,a=high", "given twice"),
                          ("choice", "column:lab_code=stimsim_value"),
                          ("choice:0", "lab_code=stimsim_value")):
        with pytest.raises(ConfigError, match=problem):
            parse_value_mapping(text)


def test_values_from_the_command_line_and_the_toml_file_merge_once(tmp_path):
    toml = tmp_path / "lab.toml"
    toml.write_text('[values.choice]\n0 = "low"\n1 = "high"\n')
    assert load_column_mapping(toml) == {}
    merged = value_mapping(["current_uA:-1=sham"], str(toml))
    assert merged == {"choice": {"0": "low", "1": "high"}, "current_uA": {"-1": "sham"}}
    assert value_mapping(["choice:0=low"], "site=electrode") == {"choice": {"0": "low"}}
    with pytest.raises(ConfigError, match="column 'choice' is given twice"):
        value_mapping(["choice:2=low"], str(toml))
    toml.write_text('[values]\nchoice = "low"\n')
    with pytest.raises(ConfigError, match=r"tables \[values.COLUMN\]"):
        load_value_mapping(toml)
    toml.write_text('[colums]\nsite = "electrode"\n')
    with pytest.raises(ConfigError, match=r"unknown keys \['colums'\]"):
        load_column_mapping(toml)


def test_correct_that_disagrees_with_the_choice_is_refused(tmp_path, table):
    swapped = table.assign(choice=table["choice"].map({"low": "high", "high": "low"}))  # codes read the wrong way
    with pytest.raises(FileFormatError, match=r"column 'correct', row\(s\) .*every checked row disagrees: the "
                                              r"choice codes are most likely the other way round"):
        load_sessions(write_csv(swapped, tmp_path / "swapped.csv"))
    broken = table.copy()
    row = int(np.flatnonzero(table["step"].to_numpy() == 0)[0])  # at step 0 only "low" is correct
    broken.loc[row, "correct"] = not broken.loc[row, "correct"]
    with pytest.raises(FileFormatError, match=rf"column 'correct', row\(s\) {row + 1}: 'correct' disagrees with the "
                                              rf"choice .*; the choices or the 'correct' values of these rows are wrong"):
        load_sessions(write_csv(broken, tmp_path / "broken.csv"))
    # the centre step is not checked (a lab may reward either answer there), nor a file without the column
    centre = table.assign(correct=np.where(table["step"] == 3, True, table["correct"]))
    assert len(load_sessions(write_csv(centre, tmp_path / "centre.csv"))) == len(table)
    assert len(load_sessions(write_csv(swapped.drop(columns="correct"), tmp_path / "no.csv"))) == len(table)


def test_correct_may_be_left_empty_only_at_the_centre_step(tmp_path, table):
    """The centre step of 7 (step 3) has no correct answer: a rig's CSV that leaves 'correct' empty there loads (read
    as None); an empty cell at step 0 ('low' is correct there) is refused naming its rows."""
    blank = table.assign(correct=table["correct"].astype(object).where(table["step"] != 3, ""))
    loaded = load_sessions(write_csv(blank, tmp_path / "blank.csv"))
    centre = (loaded["step"] == 3).to_numpy()
    assert centre.any() and all(value is None for value in loaded["correct"][centre])
    assert loaded["correct"][~centre].tolist() == table["correct"][~centre].tolist()
    rows = np.flatnonzero(table["step"].to_numpy() == 0)
    blank.loc[rows, "correct"] = ""
    shown = ", ".join(str(row + 1) for row in rows[:5])
    with pytest.raises(FileFormatError, match=rf"column 'correct', row\(s\) {shown} \(\+{rows.size - 5} more\): "
                                              r"empty 'correct' at a step that has a correct answer \(only the "
                                              r"sequence's centre step, 3, may leave it empty\)"):
        load_sessions(write_csv(blank, tmp_path / "blank_low.csv"))


def test_image_ids_that_disagree_with_electrode_step_or_sequence_are_refused(tmp_path, table):
    shifted = table.assign(step=table["step"] + 1)  # steps counted from 1 in the step column only
    with pytest.raises(FileFormatError, match=r"column 'stimulus_id', row\(s\) 1, 2, 3, 4, 5 \(\+115 more\): the "
                                              r"image id names another step than column 'step'"):
        load_sessions(write_csv(shifted, tmp_path / "shifted.csv"))
    mixed = table.copy()
    mixed.loc[7, "stimulus_id"] = "99_seq0_step" + str(mixed.loc[7, "step"])
    mixed.loc[8, "sequence"] = 2
    with pytest.raises(FileFormatError) as refused:
        load_sessions(write_csv(mixed, tmp_path / "mixed.csv"))
    assert "column 'stimulus_id', row(s) 8: the image id names another electrode than column 'electrode'; " \
           f"e.g. '99_seq0_step{mixed.loc[7, 'step']}'" in str(refused.value)
    assert "row(s) 9: the image id names another sequence" in str(refused.value)
    # a rig that logs the image file's name: an id like "elec 7" is written "elec_7" there (and "site2_elec_7" where
    # two ids share that stem); another electrode's file is still refused
    spaced = table.assign(electrode="elec " + table["electrode"].astype(str),
                          stimulated_electrode=np.where(table["stimulated_electrode"] == "sham", "sham",
                                                        "elec " + table["stimulated_electrode"].astype(str)))
    logged = spaced.assign(stimulus_id="elec_" + table["stimulus_id"])
    logged.loc[3, "stimulus_id"] = "site2_" + logged.loc[3, "stimulus_id"]
    assert len(load_sessions(write_csv(logged, tmp_path / "logged.csv"))) == len(table)
    logged.loc[5, "stimulus_id"] = "elec_99_seq0_step" + str(logged.loc[5, "step"])
    with pytest.raises(FileFormatError, match=r"column 'stimulus_id', row\(s\) 6: the image id names another "
                                              r"electrode than column 'electrode'"):
        load_sessions(write_csv(logged, tmp_path / "logged_wrong.csv"))
    # a lab's own image ids are not read
    own = table.assign(stimulus_id=[f"morph_{i}.png" for i in range(len(table))])
    assert len(load_sessions(write_csv(own, tmp_path / "own.csv"))) == len(table)


def test_errors_hint_at_what_was_meant(tmp_path, table):
    """A mapping typo gets a "did you mean"; a bad value is named in the file's own column and as written; an
    unknown electrode comes with examples of the known ids; a sham code that is not mapped, with --values."""
    with pytest.raises(ConfigError, match=r"unknown stimsim column\(s\) \['current_ua'\]; did you mean 'current_uA'\?"):
        parse_column_mapping("amp=current_ua")
    lab = table.rename(columns={"choice": "response"})
    path = write_csv(lab, tmp_path / "lab.csv")
    with pytest.raises(FileFormatError, match=r"names column\(s\) \['respnse'\] that no file given has; did you mean "
                                              r"'response'\?"):
        load_sessions(path, columns={"respnse": "choice"})
    lab.loc[3, "response"] = "Left"
    lab.loc[5, "response"] = ""
    path = write_csv(lab, tmp_path / "lab.csv")
    with pytest.raises(FileFormatError) as refused:
        load_sessions(path, columns={"response": "choice"})
    message = str(refused.value)
    assert "column 'choice', row(s) 4: choice outside the task's options" in message
    assert "e.g. 'Left' (the file's column 'response')" in message  # the value as the file writes it
    assert message.count("row(s) 6") == 1  # an empty choice is one problem, not two
    with pytest.raises(FileFormatError, match=r"electrode not in the plan's sites \(2 known ids, e.g. '1', '2'\)"):
        load_sessions(write_csv(table, tmp_path / "s.csv"), electrodes=["2", "1"], electrodes_source="the plan's sites")
    coded = table.assign(stimulated_electrode=np.where(table["stimulated_electrode"] == "sham", "-1",
                                                       table["stimulated_electrode"]))
    with pytest.raises(FileFormatError, match=r"--values stimulated_electrode:CODE=sham"):
        load_sessions(write_csv(coded, tmp_path / "coded.csv"))


#: A session format from outside stimsim, in one module: tab-separated tables.
TSV_FORMAT = '''
import pandas as pd

from stimsim.lab.sessions import SessionFormat, register_session_format


class TSVSessions(SessionFormat):
    suffixes = (".tsv",)

    def read(self, path):
        return pd.read_csv(path, sep="\\t", dtype=str, keep_default_na=False), None, None
'''


def test_a_session_format_from_another_package_is_one_module(tmp_path, outside_package, table):
    """A format registered from outside reads like the built-in ones: the same trials written as CSV and as TSV
    load to the same table, and a TSV file with a bad row is refused by the shared validation with the same
    message as the CSV file. Declared by an installed package's entry point, a fresh process finds it by suffix."""
    from stimsim.lab.sessions import SESSION_FORMATS

    package = outside_package("labfmt_t")
    TSVSessions = package.module("tsv", TSV_FORMAT).TSVSessions

    table.to_csv(tmp_path / "s.tsv", sep="\t", index=False)
    SESSION_FORMATS.register("TSV", TSVSessions)
    try:
        from_tsv = load_sessions(tmp_path / "s.tsv")
        pd.testing.assert_frame_equal(from_tsv.drop(columns="file"),
                                      load_sessions(write_csv(table, tmp_path / "s.csv")).drop(columns="file"))
        bad = table.copy()
        bad.loc[3, "choice"] = "left"
        bad.to_csv(tmp_path / "bad.tsv", sep="\t", index=False)
        with pytest.raises(FileFormatError) as tsv_error:
            load_sessions(tmp_path / "bad.tsv")
        with pytest.raises(FileFormatError) as csv_error:
            load_sessions(write_csv(bad, tmp_path / "bad.csv"))
        assert str(tsv_error.value).replace("bad.tsv", "bad.csv") == str(csv_error.value)
    finally:
        SESSION_FORMATS.unregister("TSV")
    with pytest.raises(FileFormatError, match=r"unknown session format '.tsv'; known: CSV \(\.csv\); HDF5 \(\.h5, "
                                              r"\.hdf5\); NWB \(\.nwb\)"):
        load_sessions(tmp_path / "s.tsv")

    run = package.run_installed("stimsim.session_formats", "TSV = labfmt_t.tsv:TSVSessions",
                                "import sys; from stimsim.lab.sessions import load_sessions; "
                                "print(len(load_sessions(sys.argv[1])))", str(tmp_path / "s.tsv"))
    assert run.returncode == 0 and run.stdout.strip() == str(len(table)), run.stderr

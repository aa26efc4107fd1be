"""Array layouts: Utah grids, CSV and Blackrock .cmp files, poses and the anatomical frame."""
from pathlib import Path

import numpy as np
import pytest

from stimsim.lab.arrays import AnatomicalPose, ArrayLayout, ArrayPose, load_layout, pose_error, utah_array
from stimsim.lab.arrays.layout import NO_CMP_DESCRIPTION
from stimsim.utilities.errors import ConfigError, FileFormatError

CMP_FIXTURE = Path(__file__).parent / "data" / "example_array.cmp"


def _nearest_neighbour_mm(positions):
    d = np.linalg.norm(positions[:, None] - positions[None], axis=2)
    np.fill_diagonal(d, np.inf)
    return d.min(1)


@pytest.mark.parametrize("kind, n, side", [("10x10", 96, 10), ("8x8", 64, 8)])
def test_utah_grids_have_their_ids_pitch_and_extent(kind, n, side):
    layout = utah_array(kind)
    assert len(layout) == n
    assert layout.electrode_ids == tuple(str(i) for i in range(1, n + 1))
    np.testing.assert_allclose(_nearest_neighbour_mm(layout.positions_mm), 0.4)
    half = (side - 1) * 0.4 / 2
    np.testing.assert_allclose(layout.positions_mm.min(0), [-half, -half])
    np.testing.assert_allclose(layout.positions_mm.max(0), [half, half])


@pytest.mark.parametrize("pitch_mm", [400, 0.0, -0.4, float("nan"), "0.4"])
def test_a_pitch_that_cannot_be_mm_is_refused_in_code_as_in_files(pitch_mm):
    """400 (µm given as mm) would make a Utah array 3.6 m across."""
    for make in (lambda: utah_array("10x10", pitch_mm=pitch_mm),
                 lambda: ArrayLayout.from_cmp(CMP_FIXTURE, pitch_mm=pitch_mm)):
        with pytest.raises(ConfigError, match=r"pitch_mm: the electrode spacing in mm, from 0.005 to 5 \(a Utah "
                                              r"array's is 0.4; µm given as mm are 1000 times too many\); got"):
            make()


def test_utah_10x10_leaves_the_four_corners_unconnected():
    positions = utah_array("10x10").positions_mm
    for corner in [(-1.8, -1.8), (1.8, -1.8), (-1.8, 1.8), (1.8, 1.8)]:
        assert np.min(np.linalg.norm(positions - corner, axis=1)) > 0.39
    # electrode 1 is the second cell of the bottom row; electrode 9 starts the second row
    np.testing.assert_allclose(utah_array("10x10").position_of("1"), (-1.4, -1.8))
    np.testing.assert_allclose(utah_array("10x10").position_of("9"), (-1.8, -1.4))


def test_pose_rotates_about_the_centre_then_translates():
    layout = ArrayLayout("two", ("a", "b"), np.array([[1.0, 0.0], [0.0, 2.0]]))
    on_sheet = layout.on_sheet(ArrayPose(5.0, 3.0, rotation_deg=90.0))
    np.testing.assert_allclose(on_sheet, [[5.0, 4.0], [3.0, 3.0]], atol=1e-12)
    scaled = layout.on_sheet(ArrayPose(0.0, 0.0, rotation_deg=180.0, scale=2.0))
    np.testing.assert_allclose(scaled, [[-2.0, 0.0], [0.0, -4.0]], atol=1e-12)
    pose = ArrayPose(1.0, -2.0, 33.0, 1.5)
    np.testing.assert_allclose(pose.inverse(pose.apply(layout.positions_mm)), layout.positions_mm, atol=1e-12)
    assert ArrayPose.from_dict(pose.to_dict()) == pose


def test_rotation_keeps_pitch_and_ids_survive_subset_and_rotation():
    layout = utah_array("10x10")
    on_sheet = layout.on_sheet(ArrayPose(5.0, 5.0, rotation_deg=37.0))
    np.testing.assert_allclose(_nearest_neighbour_mm(on_sheet), 0.4)
    np.testing.assert_allclose(on_sheet.mean(0), [5.0, 5.0], atol=1e-12)
    part = layout.subset(["96", "1", "50"])
    assert part.electrode_ids == ("96", "1", "50")
    np.testing.assert_allclose(part.positions_mm[1], layout.position_of("1"))
    np.testing.assert_allclose(part.on_sheet(ArrayPose(5, 5, 37))[0], on_sheet[layout.index_of("96")])


def test_pose_error_wraps_angles():
    errors = pose_error(ArrayPose(3.0, 4.0, 359.0), ArrayPose(0.0, 0.0, 1.0))
    assert errors["pose_error_mm"] == pytest.approx(5.0)
    assert errors["pose_error_deg"] == pytest.approx(2.0)


def test_cmp_file_is_parsed_with_channels_positions_and_labels():
    layout = ArrayLayout.from_cmp(CMP_FIXTURE)
    # channel = bank index * 32 + elec: A1 → 1, A3 → 3, B2 → 34, C17 → 81, A2 → 2, D32 → 128
    assert layout.electrode_ids == ("1", "3", "34", "81", "2", "128")
    assert layout.labels == ("elec6", "elec5", "elec4", "elec3", "elec2", "elec1")
    # 3 columns × 2 rows at 0.4 mm, centred: columns at -0.4, 0, 0.4; rows at -0.2 (row 0), 0.2 (row 1)
    np.testing.assert_allclose(layout.position_of("1"), (-0.4, 0.2))
    np.testing.assert_allclose(layout.position_of("128"), (0.4, -0.2))
    np.testing.assert_allclose(layout.position_of("2"), (0.0, -0.2))
    by_label = ArrayLayout.from_cmp(CMP_FIXTURE, electrode_id="label")
    np.testing.assert_allclose(by_label.position_of("elec1"), (0.4, -0.2))


def test_cmp_labels_keep_their_spaces(tmp_path):
    """A label is everything after the fourth field: Central labels such as 'elec 12' or 'Utah A 3' stay whole,
    whether the fields are separated by tabs or by runs of spaces."""
    path = tmp_path / "spaced.cmp"
    path.write_text("// labels with spaces\nCerebus mapping for array 2x1\n"
                    "0\t0\tA\t1\telec 12\n"
                    "1   0  B  3   Utah A 3  \n")
    layout = ArrayLayout.from_cmp(path)
    assert layout.electrode_ids == ("1", "35")  # A1 → 1, B3 → 32 + 3
    assert layout.labels == ("elec 12", "Utah A 3")
    by_label = ArrayLayout.from_cmp(path, electrode_id="label")
    assert by_label.electrode_ids == ("elec 12", "Utah A 3")
    # 2 columns at 0.4 mm, centred: col 0 at -0.2, col 1 at +0.2
    np.testing.assert_allclose(by_label.position_of("Utah A 3"), (0.2, 0.0))
    # a spaced label on the first line is still recognised as an electrode line, not taken for the description
    path.write_text("0\t0\tA\t1\telec 12\n1\t0\tA\t2\telec 13\n")
    assert ArrayLayout.from_cmp(path, electrode_id="label").electrode_ids == ("elec 12", "elec 13")


def test_electrodes_in_array_order_whatever_order_a_file_lists_them():
    """The example map lists A1 (col 0, row 1), A3 (1, 1), B2 (2, 1), C17 (0, 0), A2 (1, 0), D32 (2, 0): by place, rows
    from the bottom then columns from the left, that is C17, A2, D32, A1, A3, B2 = channels 81, 2, 128, 1, 3, 34."""
    layout = ArrayLayout.from_cmp(CMP_FIXTURE)
    expected = ["81", "2", "128", "1", "3", "34"]
    assert layout.in_array_order(layout.electrode_ids) == expected
    assert layout.in_array_order(["34", "3", "1", "128", "2", "81"]) == expected
    assert layout.in_array_order(["3", "2"]) == ["2", "3"]
    utah = utah_array("10x10")
    assert utah.in_array_order(reversed(utah.electrode_ids)) == list(utah.electrode_ids)  # ids run row by row


def test_cmp_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.cmp"
    bad.write_text("Cerebus mapping\n0\t0\tA\t1\telec1\n1\t0\tE\t2\telec2\n")
    with pytest.raises(FileFormatError, match=r"bad.cmp: line 3, column bank"):
        ArrayLayout.from_cmp(bad)
    bad.write_text("Cerebus mapping\n0\t0\tA\t1\n0\t0\tA\t2\n")
    with pytest.raises(FileFormatError, match="line 3: grid position col 0, row 0 repeats line 2"):
        ArrayLayout.from_cmp(bad)
    bad.write_text("Cerebus mapping\n0\t0\tA\t40\n")
    with pytest.raises(FileFormatError, match="column elec"):
        ArrayLayout.from_cmp(bad)
    bad.write_text("// only comments\nCerebus mapping for array 0\n")
    with pytest.raises(FileFormatError, match="bad.cmp: no electrode lines"):
        ArrayLayout.from_cmp(bad)
    # one channel or one label on two electrodes: a stimulator would drive one of them for both sites
    bad.write_text("Cerebus mapping\n0\t0\tA\t1\telec1\n1\t0\tA\t1\telec2\n")
    with pytest.raises(FileFormatError, match="line 3: bank A, elec 1 repeats line 2"):
        ArrayLayout.from_cmp(bad, electrode_id="label")
    bad.write_text("Cerebus mapping\n0\t0\tA\t1\telec1\n1\t0\tA\t2\telec1\n")
    with pytest.raises(FileFormatError, match="line 3: label 'elec1' repeats line 2"):
        ArrayLayout.from_cmp(bad)


@pytest.mark.parametrize("description", ["Cerebus mapping for array 2x1\n", ""])
def test_a_cmp_saved_with_a_byte_order_mark_keeps_every_electrode(tmp_path, description):
    """Windows tools write a byte-order mark: it is no part of the first line (which had read as a description,
    losing the first electrode, or had turned a comment into one)."""
    text = "// exported map\n" * bool(description) + description + "0\t0\tA\t1\telec1\n1\t0\tA\t2\telec2\n"
    marked = tmp_path / "marked.cmp"
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode())
    layout = ArrayLayout.from_cmp(marked, electrode_id="label")
    assert layout.electrode_ids == ("elec1", "elec2")
    assert layout.description == (description.strip() or NO_CMP_DESCRIPTION)


def test_cmp_with_or_without_a_description_line(tmp_path):
    """A map written by hand has comments and then electrode lines: the first line that is not a comment is the
    first electrode when it reads as one (never lost as a description); a map with a description line keeps it."""
    lines = "0\t1\tA\t1\telec1\n1\t1\tA\t2\telec2\n0\t0\tA\t3\telec3\n1\t0\tA\t4\telec4\n"
    bare = tmp_path / "nodesc.cmp"
    bare.write_text("// map file written by hand: comments, then electrode lines, no description line\n"
                    "// col row bank elec label\n" + lines)
    layout = ArrayLayout.from_cmp(bare, electrode_id="label")
    assert layout.electrode_ids == ("elec1", "elec2", "elec3", "elec4")
    assert layout.description == NO_CMP_DESCRIPTION
    # 2 × 2 grid at 0.4 mm, centred on the grid: col 0 → x −0.2, row 1 → y +0.2
    np.testing.assert_allclose(layout.position_of("elec1"), (-0.2, 0.2))
    np.testing.assert_allclose(layout.position_of("elec4"), (0.2, -0.2))
    assert layout.cerebus_numbers("elec3") == {"channel": 3, "bank": "A", "elec": 3}
    described = tmp_path / "desc.cmp"
    described.write_text("// comment\r\nCerebus mapping for array 2x2 SN 1234\r\n" + lines.replace("\n", "\r\n"))
    with_description = ArrayLayout.from_cmp(described)
    assert with_description.electrode_ids == ("1", "2", "3", "4")
    assert with_description.description == "Cerebus mapping for array 2x2 SN 1234"
    # the banks survive a subset and the dictionary a subject directory stores
    again = ArrayLayout.from_dict(with_description.subset(["4", "1"]).to_dict())
    assert again.cerebus == (("A", 4), ("A", 1)) and again.description == with_description.description
    assert utah_array("10x10").cerebus_numbers("1") is None


def test_cmp_numbers_beyond_a_grid_and_labels_that_are_not_utf8_name_the_line(tmp_path):
    bad = tmp_path / "bad.cmp"
    bad.write_text("Cerebus mapping\n0\t0\tA\t1\telec1\n1" + "0" * 400 + "\t0\tA\t2\telec2\n")
    with pytest.raises(FileFormatError, match=r"bad.cmp: line 3: col and row must be integers in 0–1000, got '1000"):
        ArrayLayout.from_cmp(bad)
    bad.write_bytes(b"Cerebus mapping\n0\t0\tA\t1\telec1\n1\t0\tA\t2\t\xe9lec2\n")
    with pytest.raises(FileFormatError, match=r"bad.cmp: line 3, column label: not UTF-8 text"):
        ArrayLayout.from_cmp(bad, electrode_id="label")


def test_csv_layout_and_its_errors(tmp_path):
    path = tmp_path / "custom.csv"
    path.write_text("electrode_id,x_mm,y_mm\nch7,1.0,1.0\nch2,2.0,1.0\nch9,1.0,3.0\n")
    layout = ArrayLayout.from_csv(path)
    assert layout.electrode_ids == ("ch7", "ch2", "ch9")
    np.testing.assert_allclose(layout.positions_mm, [[-0.5, -1.0], [0.5, -1.0], [-0.5, 1.0]])
    assert load_layout(path).electrode_ids == layout.electrode_ids
    path.write_text("electrode_id,x_mm,y_mm\nch7,1.0,1.0\nch2,two,1.0\n")
    with pytest.raises(FileFormatError, match="row 3, column x_mm"):
        ArrayLayout.from_csv(path)
    path.write_text("id,x,y\n1,0,0\n")
    with pytest.raises(FileFormatError, match=r"missing column 'electrode_id'"):
        ArrayLayout.from_csv(path)
    with pytest.raises(ConfigError, match="no electrode '200'"):
        utah_array().subset(["1", "200"])
    with pytest.raises(ConfigError, match="unknown Utah array"):
        utah_array("6x6")


def test_csv_layout_in_micrometres_and_positions_implausible_for_mm(tmp_path):
    """x_um, y_um columns are micrometres (÷ 1000); micrometres written under x_mm, y_mm put a 400 µm pitch at
    400 mm and are refused, naming the file, the columns and the µm option."""
    path = tmp_path / "lab.csv"
    rows = [("e1", 0, 0), ("e2", 400, 0), ("e3", 0, 400), ("e4", 400, 400)]
    path.write_text("electrode_id,x_um,y_um\n" + "".join(f"{e},{x},{y}\n" for e, x, y in rows))
    layout = load_layout(path)
    np.testing.assert_allclose(layout.positions_mm, [[-0.2, -0.2], [0.2, -0.2], [-0.2, 0.2], [0.2, 0.2]])
    np.testing.assert_allclose(_nearest_neighbour_mm(layout.positions_mm), 0.4)
    path.write_text("electrode_id,x_mm,y_mm\n" + "".join(f"{e},{x},{y}\n" for e, x, y in rows))
    with pytest.raises(FileFormatError, match=r"lab.csv: columns x_mm, y_mm: electrodes are 400 mm from their nearest "
                                              r"neighbour \(median\), implausible .* in x_um, y_um"):
        ArrayLayout.from_csv(path)
    path.write_text("electrode_id,x_mm,y_mm\n" + "".join(f"{e},{x / 1e6},{y / 1e6}\n" for e, x, y in rows))
    with pytest.raises(FileFormatError, match=r"lab.csv: columns x_mm, y_mm: electrodes are 0.0004 mm .* \(< 0.005 mm\)"):
        ArrayLayout.from_csv(path)  # metres
    path.write_text("electrode_id,x_mm,y_mm\ne1,0,0\ne2,0.4,0\ne3,0.4,0\n")
    with pytest.raises(FileFormatError, match=r"lab.csv: columns x_mm, y_mm: electrodes 'e2' and 'e3' share the position"):
        ArrayLayout.from_csv(path)
    for header in ("electrode_id,x_mm,y_mm,x_um,y_um", "electrode_id,x_mm,y_um"):
        path.write_text(header + "\ne1,0,0,0,0\n")
        with pytest.raises(FileFormatError, match=r"lab.csv: position columns: give x_mm, y_mm .* or x_um, y_um"):
            ArrayLayout.from_csv(path)
    path.write_text("electrode_id,x_mm,y_mm\ne1,0,0\n")
    assert len(ArrayLayout.from_csv(path)) == 1  # one electrode has no spacing to judge


def test_anatomical_frame_from_electrode_one():
    layout = utah_array("10x10")
    anatomy = AnatomicalPose(ap_mm=10.0, ml_mm=-20.0, rotation_deg=90.0, hemisphere="left", reference="1")
    coords = anatomy.electrode_coordinates(layout)
    assert coords["1"] == pytest.approx((10.0, -20.0))
    # electrode 2 is 0.4 mm along +x; rotated 90° that is lateral; left hemisphere → ML decreases
    assert coords["2"] == pytest.approx((10.0, -20.4))
    # electrode 9 sits at (dx, dy) = (-0.4, +0.4) from electrode 1; rotated by 90°:
    # anterior = dx·cos − dy·sin = -0.4, lateral = dx·sin + dy·cos = -0.4 → ML = −20 − (−0.4) in the left hemisphere
    assert coords["9"] == pytest.approx((9.6, -19.6))
    with pytest.raises(ConfigError, match="hemisphere"):
        AnatomicalPose(0, 0, hemisphere="top")
    # ML is signed (right positive): an unsigned ML in the left hemisphere would mirror every site across the midline
    with pytest.raises(ConfigError, match=r"ml_mm = 20 lies in the other hemisphere than 'left'.*give ml_mm = -20"):
        AnatomicalPose(ap_mm=10.0, ml_mm=20.0, hemisphere="left")
    with pytest.raises(ConfigError, match=r"ap_mm = 12500 mm lies outside a macaque brain \(\|ap_mm\| <= 60 mm\); is "
                                          r"it in µm\?"):
        AnatomicalPose(ap_mm=12500.0, ml_mm=18.0)
    with pytest.raises(ConfigError, match=r"rotation_deg must lie in \[-360, 360\], got 1e\+308"):
        AnatomicalPose(ap_mm=12.0, ml_mm=18.0, rotation_deg=1e308)

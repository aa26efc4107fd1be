"""Stimulus sets: construction, validation, file round trips, the named sets and pixel noise."""
import csv
import re
import warnings
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr
from PIL import Image

from stimsim.data import manifest
from stimsim.data.images import TransparentImageWarning, load_image
from stimsim.data.stimuli import (FASHION_MNIST_CLASSES, StimulusSet, fashion_mnist, from_folder, from_table,
                                  lfw_subset, load_stimulus_source, moeller2017, pixel_noise)
from stimsim.utilities.errors import ConfigError, FileFormatError

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(manifest.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(manifest.MANIFEST_DIR_ENV, raising=False)
    monkeypatch.delenv(manifest.MIRROR_DIR_ENV, raising=False)


def _png(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return array


@pytest.fixture
def image_folder(tmp_path):
    rng = np.random.default_rng(3)
    root = tmp_path / "stimuli"
    written = {
        "faces/f1.png": _png(root / "faces" / "f1.png", rng.integers(0, 256, (6, 5), dtype=np.uint8)),
        "faces/f2.png": _png(root / "faces" / "f2.png", rng.integers(0, 256, (6, 5), dtype=np.uint8)),
        "houses/deep/h1.png": _png(root / "houses" / "deep" / "h1.png",
                                   rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)),
    }
    (root / "houses" / "notes.txt").write_text("not an image")
    return root, written


def _small_set(n=4, name="small", prefix="s"):
    images = [np.full((3, 4), i / 10, dtype=np.float32) for i in range(n)]
    return StimulusSet(name=name, images=images, stimulus_id=np.asarray([f"{prefix}{i}" for i in range(n)]),
                       labels={"category": np.asarray(["a", "b"] * (n // 2)), "size_deg": np.arange(n) * 1.5})


# --------------------------------------------------------------------------- the container


def test_stimulus_set_validation():
    good = [np.zeros((2, 2), np.float32)] * 2
    with pytest.raises(ValueError, match="unique"):
        StimulusSet("x", good, np.asarray(["a", "a"]))
    with pytest.raises(ValueError, match="2 images but 1"):
        StimulusSet("x", good, np.asarray(["a"]))
    with pytest.raises(ValueError, match="dtype uint8"):
        StimulusSet("x", [np.zeros((2, 2), np.uint8)], np.asarray(["a"]))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        StimulusSet("x", [np.full((2, 2), 1.5)], np.asarray(["a"]))
    with pytest.raises(ValueError, match=r"\(H, W\) or \(H, W, 3\)"):
        StimulusSet("x", [np.zeros((2, 2, 4))], np.asarray(["a"]))
    with pytest.raises(ValueError, match="one value per image"):
        StimulusSet("x", good, np.asarray(["a", "b"]), labels={"category": ["face"]})
    with pytest.raises(ValueError, match="reserved|other than 'stimulus_id'"):
        StimulusSet("x", good, np.asarray(["a", "b"]), labels={"stimulus_id": ["p", "q"]})
    converted = StimulusSet("x", [np.zeros((2, 2), np.float64)], ["a"])
    assert converted.images[0].dtype == np.float32


def test_subset_concat_and_coords():
    stimuli = _small_set()
    picked = stimuli.subset(stimuli.labels["category"] == "b")
    assert list(picked.stimulus_id) == ["s1", "s3"]
    assert picked.labels["size_deg"].tolist() == [1.5, 4.5]
    assert float(picked.images[1][0, 0]) == pytest.approx(0.3)
    assert list(stimuli.subset([3, 0]).stimulus_id) == ["s3", "s0"]
    with pytest.raises(ValueError, match="indices must lie"):
        stimuli.subset([4])
    with pytest.raises(ValueError, match="boolean mask"):
        stimuli.subset([True, False])

    both = StimulusSet.concat(stimuli, _small_set(prefix="t"))
    assert len(both) == 8 and both.name == "small+small"
    assert list(both.stimulus_id[3:5]) == ["s3", "t0"]
    with pytest.raises(ValueError, match="unique"):
        StimulusSet.concat(stimuli, stimuli)
    with pytest.raises(ValueError, match="different labels"):
        StimulusSet.concat(stimuli, _small_set(prefix="t").with_labels(extra=np.zeros(4)))

    coords = stimuli.with_labels(is_face=np.asarray([True, False, True, False])).to_coords()
    responses = xr.DataArray(np.arange(8.0).reshape(4, 2), dims=("stimulus_id", "unit"), coords=coords)
    assert responses.sel(stimulus_id="s2").is_face.item()
    assert responses.where(responses.category == "a", drop=True).stimulus_id.values.tolist() == ["s0", "s2"]


# --------------------------------------------------------------------------- folders and tables


def test_from_folder_labels_ids_and_pixels(image_folder):
    root, written = image_folder
    stimuli = from_folder(root)
    assert stimuli.name == "stimuli"
    assert list(stimuli.stimulus_id) == sorted(written)
    assert list(stimuli.labels["category"]) == ["faces", "faces", "houses"]
    for stimulus_id, image in zip(stimuli.stimulus_id, stimuli.images):
        np.testing.assert_allclose(image, written[stimulus_id] / 255.0, atol=1e-6)
    assert stimuli.images[2].shape == (4, 4, 3)
    assert from_folder(root, label_from=None).labels == {}
    # a folder of loose images (none in a class subfolder): refused with the way to read them, which TOML can write
    loose = root.parent / "loose"
    loose.mkdir()
    Image.fromarray(np.zeros((4, 4), dtype=np.uint8)).save(loose / "a.png")
    with pytest.raises(FileFormatError, match=r"found 1 at the top level, e.g. a.png \(label_from = \"none\" reads"):
        load_stimulus_source({"source": "folder", "path": str(loose)})
    assert list(load_stimulus_source({"source": "folder", "path": str(loose), "label_from": "none"}).stimulus_id) \
        == ["a.png"]


def test_images_keep_their_contrast_at_every_bit_depth_and_mode(tmp_path):
    """A 16-bit image is divided by 65535 (not by its own maximum), a float image is taken as it is, and
    palette, CMYK and RGBA images reach the same gray levels as the 8-bit original."""
    gray = np.linspace(0.2, 0.6, 48).reshape(6, 8)  # planted: its brightest pixel is 0.6, not white
    eight = np.round(gray * 255).astype(np.uint8)
    Image.fromarray(np.round(gray * 65535).astype(np.uint16)).save(tmp_path / "deep.png")
    Image.fromarray(gray.astype(np.float32)).save(tmp_path / "float.tiff")
    Image.fromarray(eight).convert("RGB").convert("CMYK").save(tmp_path / "cmyk.tiff")
    Image.fromarray(eight).convert("RGBA").save(tmp_path / "rgba.png")
    Image.fromarray(eight).convert("P").save(tmp_path / "palette.png")
    np.testing.assert_allclose(load_image(tmp_path / "deep.png"), gray, atol=1e-4)
    np.testing.assert_allclose(load_image(tmp_path / "float.tiff"), gray, atol=1e-6)
    for name in ("cmyk.tiff", "rgba.png", "palette.png"):
        image = load_image(tmp_path / name)
        assert image.shape == (6, 8, 3)
        np.testing.assert_allclose(image, np.repeat(eight[..., None] / 255.0, 3, axis=2), atol=1.5 / 255)


def test_transparent_pixels_are_said_once_per_set_and_opaque_alpha_is_silent(tmp_path):
    """Alpha is dropped when an image is read, so transparent pixels show the colour stored under them (here black,
    where the monkey may have seen gray): an RGBA or palette image with a transparent pixel is named, one warning per
    folder or table; an RGBA image whose pixels are all at least half opaque is read without a word."""
    rgba = np.zeros((6, 8, 4), np.uint8)
    rgba[1:5, 2:6] = (180, 180, 180, 255)  # a gray square on a transparent black ground
    (tmp_path / "set" / "face").mkdir(parents=True)
    (tmp_path / "set" / "object").mkdir()
    Image.fromarray(rgba, "RGBA").save(tmp_path / "set" / "face" / "cutout.png")
    palette = Image.fromarray(rgba[..., :3]).convert("P")
    palette.info["transparency"] = palette.getpixel((0, 0))
    palette.save(tmp_path / "set" / "face" / "palette.png", transparency=palette.getpixel((0, 0)))
    opaque = rgba.copy()
    opaque[..., 3] = 255
    opaque[0, :, 3] = 220  # slightly translucent edge pixels, as anti-aliasing leaves them
    Image.fromarray(opaque, "RGBA").save(tmp_path / "set" / "object" / "opaque.png")
    with pytest.warns(TransparentImageWarning, match=r"cutout.png: the image has transparent pixels"):
        image = load_image(tmp_path / "set" / "face" / "cutout.png")
    assert image[0, 0].tolist() == [0.0, 0.0, 0.0]  # the colour stored under the transparent pixel
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_image(tmp_path / "set" / "object" / "opaque.png")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_folder(tmp_path / "set")
    first = tmp_path / "set" / "face" / "cutout.png"
    assert [str(w.message) for w in caught] == [
        f"{tmp_path / 'set'}: 2 of 3 images have transparent pixels (the first: {first}); their alpha is dropped, so "
        "those pixels show the colour stored under them (flatten the images onto the background the monkey saw)"]
    (tmp_path / "set" / "table.csv").write_text("stimulus_id,path\na,object/opaque.png\nb,face/palette.png\n")
    with pytest.warns(UserWarning, match=r"table.csv: 1 of 2 images have transparent pixels \(the first: .*palette"):
        from_table(tmp_path / "set" / "table.csv")


def test_images_outside_their_range_and_damaged_files_are_refused(tmp_path):
    Image.fromarray(np.full((4, 4), 2.5, np.float32)).save(tmp_path / "bright.tiff")
    Image.fromarray(np.full((4, 4), 70000, np.int32)).save(tmp_path / "wide.tiff")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "whole.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "whole.png").read_bytes()[:40])
    (tmp_path / "text.jpg").write_text("not an image")
    with pytest.raises(FileFormatError, match=r"bright.tiff: floating-point image .* from 2.5 to 2.5"):
        load_image(tmp_path / "bright.tiff")
    with pytest.raises(FileFormatError, match=r"wide.tiff: integer image .* from 70000 to 70000"):
        load_image(tmp_path / "wide.tiff")
    for name in ("cut.png", "text.jpg"):
        with pytest.raises(FileFormatError, match=f"{name}: cannot decode image"):
            load_image(tmp_path / name)


def test_from_folder_refuses_loose_images_and_empty_folders(image_folder, tmp_path):
    root, _ = image_folder
    _png(root / "loose.png", np.zeros((2, 2), np.uint8))
    with pytest.raises(FileFormatError, match="loose.png"):
        from_folder(root)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileFormatError, match="no image files"):
        from_folder(tmp_path / "empty")
    with pytest.raises(ValueError, match="label_from"):
        from_folder(root, label_from="filename")


def test_csv_table_round_trip(image_folder):
    root, written = image_folder
    table = root / "table.csv"
    with open(table, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["stimulus_id", "path", "category", "repeat", "contrast", "session"])
        writer.writerow(["face_1", "faces/f1.png", "face", "1", "0.5", "1_2"])
        writer.writerow(["house_1", str(root / "houses" / "deep" / "h1.png"), "house", "2", "1", "3_4"])
    stimuli = from_table(table)
    assert stimuli.name == "table"
    assert list(stimuli.stimulus_id) == ["face_1", "house_1"]
    assert stimuli.labels["category"].tolist() == ["face", "house"]
    assert stimuli.labels["repeat"].dtype == np.int64 and stimuli.labels["repeat"].tolist() == [1, 2]
    assert stimuli.labels["contrast"].dtype == np.float64
    assert stimuli.labels["session"].tolist() == ["1_2", "3_4"]
    np.testing.assert_allclose(stimuli.images[0], written["faces/f1.png"] / 255.0, atol=1e-6)

    table.write_text("stimulus_id,path\nmissing,faces/none.png\n")
    with pytest.raises(FileFormatError, match="line 2: image file .*none.png not found"):
        from_table(table)
    table.write_text("stimulus_id,file\na,faces/f1.png\n")
    with pytest.raises(FileFormatError, match=r"missing column\(s\) \['path'\]"):
        from_table(table)
    table.write_text("stimulus_id,path\na,faces/f1.png\na,faces/f2.png\n")
    with pytest.raises(FileFormatError, match="repeated"):
        from_table(table)
    # a column named twice: the csv module would keep the last one and drop the other unseen
    table.write_text("stimulus_id,path,category,category\na,faces/f1.png,face,house\n")
    with pytest.raises(FileFormatError, match=r"column\(s\) \['category'\] appear more than once"):
        from_table(table)


def test_hdf5_round_trip(tmp_path):
    stimuli = _small_set()
    path = stimuli.to_hdf5(tmp_path / "set.h5")
    again = from_table(path)
    assert again.name == "small"
    assert list(again.stimulus_id) == list(stimuli.stimulus_id)
    assert again.labels["category"].tolist() == ["a", "b", "a", "b"]
    np.testing.assert_array_equal(again.labels["size_deg"], stimuli.labels["size_deg"])
    for original, loaded in zip(stimuli.images, again.images):
        np.testing.assert_array_equal(original, loaded)

    with h5py.File(tmp_path / "uint8.hdf5", "w") as handle:
        handle["images"] = np.array([[[0, 255]], [[51, 102]]], dtype=np.uint8)[..., None]
        handle["stimulus_id"] = np.array([b"p", b"q"])
        handle["choice"] = np.array([0, 1])
    loaded = from_table(tmp_path / "uint8.hdf5")
    np.testing.assert_allclose(loaded.images[1], [[0.2, 0.4]], atol=1e-6)
    assert loaded.labels["choice"].tolist() == [0, 1]

    with h5py.File(tmp_path / "bad.h5", "w") as handle:
        handle["images"] = np.zeros((2, 3, 3), np.float32)
        handle["stimulus_id"] = np.array([b"p", b"q"])
        handle["maps"] = np.zeros((2, 3))
    with pytest.raises(FileFormatError, match="'maps' must be a 1-D dataset"):
        from_table(tmp_path / "bad.h5")
    with h5py.File(tmp_path / "empty.h5", "w") as handle:
        handle["images"] = np.zeros((0, 3, 3), np.float32)
        handle["stimulus_id"] = np.array([], dtype="S1")
    with pytest.raises(FileFormatError, match="the table has no images"):
        from_table(tmp_path / "empty.h5")
    with pytest.raises(ValueError, match="one shape"):
        StimulusSet("mixed", [np.zeros((2, 2)), np.zeros((3, 3))], ["a", "b"]).to_hdf5(tmp_path / "m.h5")
    with pytest.raises(ValueError, match="unknown table type"):
        from_table(Path(__file__))


# --------------------------------------------------------------------------- named sets


def test_lfw_subset_faces_then_nonfaces():
    stimuli = lfw_subset()
    assert len(stimuli) == 200
    assert Counter(stimuli.labels["category"].tolist()) == {"face": 100, "nonface": 100}
    assert list(stimuli.labels["category"][:100]) == ["face"] * 100
    assert stimuli.stimulus_id[0] == "lfw_face_000" and stimuli.stimulus_id[199] == "lfw_nonface_099"
    assert all(image.shape == (25, 25) and image.dtype == np.float32 for image in stimuli.images)
    from skimage.data import lfw_subset as skimage_lfw

    np.testing.assert_allclose(np.stack(stimuli.images), skimage_lfw(), atol=1e-6)


@pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_shapes_labels_and_sampling():
    full = fashion_mnist("test")
    assert len(full) == 10000
    assert Counter(full.labels["category"].tolist()) == {name: 1000 for name in FASHION_MNIST_CLASSES}
    assert full.images[0].shape == (28, 28) and 0.0 <= full.images[0].min() <= full.images[0].max() <= 1.0
    # the first test image of Fashion-MNIST is an ankle boot
    assert full.labels["category"][0] == "ankle_boot" and full.labels["class_index"][0] == 9

    sample = fashion_mnist("test", n_per_class=3, seed=1)
    assert len(sample) == 30
    assert set(Counter(sample.labels["class_index"].tolist()).values()) == {3}
    index = int(sample.stimulus_id[0].rsplit("_", 1)[1])
    np.testing.assert_array_equal(sample.images[0], full.images[index])
    assert list(fashion_mnist("test", n_per_class=3, seed=1).stimulus_id) == list(sample.stimulus_id)
    assert list(fashion_mnist("test", n_per_class=3, seed=2).stimulus_id) != list(sample.stimulus_id)
    with pytest.raises(ValueError, match="split"):
        fashion_mnist("validation")
    with pytest.raises(ValueError, match="exceeds"):
        fashion_mnist("test", n_per_class=1001)


@pytest.mark.skipif(not (SHARED_DATA / "moeller2017").is_dir(), reason="shared Moeller 2017 data not present")
def test_moeller2017_faces_and_objects():
    stimuli = moeller2017(("Faces", "Objects"), mirror=SHARED_DATA)
    faces = stimuli.subset(stimuli.labels["stimulus_set"] == "Faces")
    assert len(faces) == 191
    assert len(set(faces.labels["identity"].tolist())) == 32
    expressions = Counter(faces.labels["expression"].tolist())
    assert set(expressions) == {"Anger", "Disgust", "Fear", "None", "Sad", "Surprise"}
    assert expressions["None"] == 31  # identity r008 has no neutral image
    missing = [i for i in set(faces.labels["identity"].tolist())
               if (faces.labels["identity"] == i).sum() != 6]
    assert missing == ["r008"]
    assert set(faces.labels["category"].tolist()) == {"face"}

    objects = stimuli.subset(stimuli.labels["stimulus_set"] == "Objects")
    assert len(objects) == 84
    first = objects.stimulus_id.tolist().index(
        "Objects/ID_alarmclock156_ALOI_objects-none-ORI_A-45_E00-alarmclock156.png")
    assert objects.labels["identity"][first] == "alarmclock156"
    assert objects.labels["view"][first] == "A-45_E00"
    assert objects.labels["azimuth_deg"][first] == -45.0
    assert objects.labels["expression"][first] == ""
    assert faces.images[0].shape == (400, 400, 3) and faces.images[0].max() <= 1.0

    abstract = moeller2017("Abstract_Faces", mirror=SHARED_DATA)
    assert len(abstract) == 16
    assert Counter(abstract.labels["rendering"].tolist()) == {"cartoon": 4, "linedrawing": 4, "mooney": 4,
                                                               "silhouette": 4}
    assert set(abstract.labels["identity"].tolist()) == {"BR", "SN", "WM", "BT"}
    with pytest.raises(ValueError, match="folders"):
        moeller2017(("Faces", "Cars"), mirror=SHARED_DATA)


# --------------------------------------------------------------------------- pixel noise


def test_floc_categories_domains_and_the_configuration_source(shared_data, monkeypatch):
    from stimsim.data.stimuli import FLOC_CATEGORIES, floc, load_stimulus_source

    monkeypatch.setenv(manifest.MIRROR_DIR_ENV, str(shared_data("natural/floc").parents[1]))
    every = floc(n_per_category=2)
    assert len(every) == 22 and every.stimulus_id[:2].tolist() == ["adult/adult-1.jpg", "adult/adult-10.jpg"]
    assert Counter(every.labels["domain"].tolist()) == {"face": 4, "body": 4, "place": 4, "character": 4,
                                                         "object": 4, "scrambled": 2}
    domain_of = dict(zip(every.labels["category"].tolist(), every.labels["domain"].tolist()))
    assert domain_of == {"adult": "face", "child": "face", "body": "body", "limb": "body", "car": "object",
                         "instrument": "object", "house": "place", "corridor": "place", "word": "character",
                         "number": "character", "scrambled": "scrambled"}
    assert sorted(domain_of) == sorted(FLOC_CATEGORIES)
    assert every.images[0].shape == (256, 256) and every.images[0].max() <= 1.0
    faces = load_stimulus_source({"source": "floc", "categories": ["adult", "child"]}, where="x.toml [stimuli]")
    assert len(faces) == 288 and set(faces.labels["domain"].tolist()) == {"face"}
    with pytest.raises(ConfigError, match=r"x.toml \[stimuli\]: categories must be distinct names from"):
        load_stimulus_source({"source": "floc", "categories": ["adult", "dog"]}, where="x.toml [stimuli]")
    with pytest.raises(ConfigError, match="n_per_category must be a positive integer"):
        load_stimulus_source({"source": "floc", "n_per_category": 0}, where="x.toml [stimuli]")


def test_imagenet_samples_in_class_order(shared_data, monkeypatch):
    from stimsim.data.stimuli import load_stimulus_source

    monkeypatch.setenv(manifest.MIRROR_DIR_ENV, str(shared_data("natural/imagenet_samples").parents[1]))
    first = load_stimulus_source({"source": "imagenet_samples", "limit": 3})
    assert first.stimulus_id.tolist() == ["n01440764_tench.jpg", "n01443537_goldfish.jpg",
                                          "n01484850_great_white_shark.jpg"]
    assert first.labels["class_index"].tolist() == [0, 1, 2]
    assert first.labels["category"].tolist() == ["tench", "goldfish", "great_white_shark"]
    assert first.labels["wnid"].tolist() == ["n01440764", "n01443537", "n01484850"]
    assert first.images[0].ndim == 3 and min(first.images[0].shape[:2]) == 256


def test_imagenet_samples_refuse_a_limit_over_the_classes_they_have(shared_data, monkeypatch):
    """A ``limit`` above the 1,000 classes is an error naming both numbers, as fLoc's ``n_per_category`` over a
    category's count is, rather than a set of fewer images than asked for."""
    from stimsim.data.stimuli import imagenet_samples, load_stimulus_source

    monkeypatch.setenv(manifest.MIRROR_DIR_ENV, str(shared_data("natural/imagenet_samples").parents[1]))
    with pytest.raises(ValueError, match=r"limit = 1001 asks for more ImageNet classes than the 1000 the samples "
                                         r"have; give at most 1000"):
        imagenet_samples(limit=1001)
    with pytest.raises(ConfigError, match=r"x.toml \[stimuli\]: limit = 5000 asks for more ImageNet classes than "
                                          r"the 1000"):
        load_stimulus_source({"source": "imagenet_samples", "limit": 5000}, where="x.toml [stimuli]")


def test_a_set_given_constant_labels_keeps_them_when_combined(shared_data, monkeypatch):
    """``labels`` in a source table gives every image of that set a text label, so that a list of sets keeps a
    label only one of them has (fLoc's ``domain`` beside ImageNet samples): the combined set marks exactly the 4
    fLoc faces with domain "face" and the 3 ImageNet samples with the given value. A label the set already has is
    refused (its own values would be lost), as is a value that is not text."""
    from stimsim.data.stimuli import load_stimulus_source
    from stimsim.subject.virtual import build_stimuli

    monkeypatch.setenv(manifest.MIRROR_DIR_ENV, str(shared_data("natural/floc").parents[1]))
    entries = [{"source": "floc", "categories": ["adult", "child", "car"], "n_per_category": 2},
               {"source": "imagenet_samples", "limit": 3}]
    assert "domain" not in build_stimuli(entries).labels  # only the labels both sets have
    entries[1]["labels"] = {"domain": "imagenet"}
    combined = build_stimuli(entries)
    assert combined.labels["domain"].tolist() == ["face"] * 4 + ["object"] * 2 + ["imagenet"] * 3
    assert combined.labels["category"].tolist()[-3:] == ["tench", "goldfish", "great_white_shark"]
    with pytest.raises(ConfigError, match=r"x.toml: 'labels': the set 'lfw_subset' already has label\(s\) "
                                          r"\['category'\]; 'labels' only adds labels it lacks"):
        load_stimulus_source({"source": "lfw_subset", "labels": {"category": "face"}}, where="x.toml")
    with pytest.raises(ConfigError, match=r"x.toml: 'labels' must be a table of label names and text values"):
        load_stimulus_source({"source": "lfw_subset", "labels": {"domain": 3}}, where="x.toml")


def test_pixel_noise_levels_fraction_and_determinism():
    rng = np.random.default_rng(0)
    images = [rng.random((40, 50)).astype(np.float32), rng.random((30, 30, 3)).astype(np.float32)]
    stimuli = StimulusSet("pair", images, ["img_a", "img_b"], labels={"category": ["face", "nonface"]})
    noisy = pixel_noise(stimuli, [100, 40, 0], seed=7)
    assert len(noisy) == 6
    assert noisy.stimulus_id.tolist() == ["img_a_signal100", "img_b_signal100", "img_a_signal40",
                                          "img_b_signal40", "img_a_signal0", "img_b_signal0"]
    assert noisy.labels["signal_percent"].tolist() == [100, 100, 40, 40, 0, 0]
    assert noisy.labels["category"].tolist() == ["face", "nonface"] * 3
    # 100 % signal: the original image
    np.testing.assert_array_equal(noisy.images[0], images[0])
    np.testing.assert_array_equal(noisy.images[1], images[1])
    # 40 % signal: exactly 60 % of the pixel positions replaced (all channels of a colour pixel)
    changed_gray = noisy.images[2] != images[0]
    assert changed_gray.sum() == round(0.6 * 40 * 50)
    changed_rgb = np.any(noisy.images[3] != images[1], axis=-1)
    assert changed_rgb.sum() == round(0.6 * 30 * 30)
    kept = ~changed_gray
    np.testing.assert_array_equal(noisy.images[2][kept], images[0][kept])
    assert 0.0 <= noisy.images[3].min() and noisy.images[3].max() <= 1.0
    # noise is uniform in [0, 1]: mean ≈ 0.5, sd ≈ 1/sqrt(12)
    pure = noisy.images[4]
    assert abs(pure.mean() - 0.5) < 0.03 and abs(pure.std() - 12 ** -0.5) < 0.02
    # 0 % signal does not depend on the image, only on (seed, level, id)
    other = StimulusSet("other", [np.zeros((40, 50), np.float32)], ["img_a"], labels={"category": ["face"]})
    np.testing.assert_array_equal(pixel_noise(other, [0], seed=7).images[0], pure)
    # deterministic given the seed, different for another seed
    np.testing.assert_array_equal(pixel_noise(stimuli, [40], seed=7).images[0], noisy.images[2])
    assert not np.array_equal(pixel_noise(stimuli, [40], seed=8).images[0], noisy.images[2])


@pytest.mark.parametrize("levels", [[], [120], [-5], [50, 50], ["high"]])
def test_pixel_noise_refuses_bad_levels(levels):
    with pytest.raises(ValueError, match="signal"):
        pixel_noise(_small_set(), levels)


def test_pixel_noise_refuses_bad_seed_and_renoising():
    with pytest.raises(ValueError, match="seed"):
        pixel_noise(_small_set(), [50], seed=-1)
    noisy = pixel_noise(_small_set(), [50])
    with pytest.raises(ValueError, match="already has a 'signal_percent'"):
        pixel_noise(noisy, [50])


def test_noise_added_before_a_resize_changes_more_pixels_than_its_level():
    """docs/data.md's reason to add the pixel noise at the model's input: at 50 % signal, noise added to five
    seeded 64 px uniform textures, or to the first five 25 px LFW faces, before they are resized to a 32 px
    input changes far more than half of the 1,024 input pixels; added at the input, exactly half."""
    from dataclasses import replace

    from docs_figures import REPO, numbers
    from stimsim.models.preprocessing import Preprocessing

    preprocessing = Preprocessing(size_px=32, channels=1, mean=(0.5,), std=(0.25,))
    rng = np.random.default_rng(0)
    textures = StimulusSet("textures", [rng.random((64, 64)).astype(np.float32) for _ in range(5)],
                           np.array([f"texture_{i}" for i in range(5)]))
    lfw = lfw_subset()
    first_faces = np.flatnonzero(lfw.labels["category"] == "face")[:5]
    faces = StimulusSet("faces", [lfw.images[i] for i in first_faces], lfw.stimulus_id[first_faces])
    changed = {}
    for stimuli in (textures, faces):
        clean = preprocessing.geometry(stimuli.images)
        noisy_before = preprocessing.geometry(pixel_noise(stimuli, [50]).images)
        noisy_at_input = pixel_noise(replace(stimuli, images=clean), [50]).images
        changed[stimuli.name] = [int(np.sum(noisy != image)) for noisy, image in zip(noisy_before, clean)]
        assert [int(np.sum(noisy != image)) for noisy, image in zip(noisy_at_input, clean)] == [512] * 5
    quoted = " ".join((REPO / "docs" / "data.md").read_text(encoding="utf-8").split())
    textures_quoted = re.search(r"64 px random textures shown to a 32 px model had ([\d,]+) of their", quoted)
    faces_quoted = re.search(r"25 px LFW crops enlarged to 32 px ([\d–]+) ", quoted)
    assert changed["textures"] == [int(textures_quoted.group(1).replace(",", ""))] * 5
    assert [min(changed["faces"]), max(changed["faces"])] == numbers(faces_quoted.group(1).replace("–", " "))

"""Topographic models: TDANN loader, model directories, preprocessing, torchvision builder."""
from __future__ import annotations

import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from stimsim.cortex.positions import build_sheet, retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.data.stimuli import StimulusSet
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.swap import swap_optimize
from stimsim.models.tdann import TDANN_AREAS, load_tdann, read_vissl_trunk
from stimsim.models.topographic import TopographicModel
from stimsim.models.torchvision_builder import build_torchvision_model
from stimsim.utilities.errors import ConfigError, DataError, FileFormatError

MOELLER_FACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "moeller2017" / "Faces"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def resnet18_state() -> dict:
    """A torchvision resnet18 state dict (fc included) with non-trivial BatchNorm statistics."""
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None)
    generator = torch.Generator().manual_seed(1)
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.copy_(0.1 * torch.randn(module.running_mean.shape, generator=generator))
            module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
    return net.state_dict()


def vissl_checkpoint(state: dict) -> dict:
    """A VISSL checkpoint as TDANN's spatial_resnet18 trunk writes it: ``base_model.`` keys, plus the
    same tensors again under ``_feature_blocks.`` with TDANN's block names."""
    trunk = {f"base_model.{key}": value for key, value in state.items()}
    for key, value in state.items():
        if key.startswith(("conv1.", "layer1.0.", "layer4.1.")):
            trunk["_feature_blocks." + key.replace("layer1.0.", "layer1_0.").replace("layer4.1.", "layer4_1.")] = value
    return {"phase_idx": 155, "iteration": 1000,
            "classy_state_dict": {"base_model": {"model": {"trunk": trunk, "heads": {}}, "meta": {}}}}


def save_spacetorch_pickle(sheet: CorticalSheet, path: Path) -> None:
    """Write ``sheet`` as a TDANN ``.pkl`` (a pickled spacetorch LayerPositions)."""
    names = ("spacetorch", "spacetorch.models", "spacetorch.models.positions")
    modules = {name: types.ModuleType(name) for name in names}
    layer_positions = type("LayerPositions", (), {"__module__": "spacetorch.models.positions"})
    modules["spacetorch.models.positions"].LayerPositions = layer_positions
    obj = layer_positions()
    obj.__dict__.update(name=sheet.name, dims=sheet.dims, coordinates=sheet.coordinates_mm,
                        neighborhood_indices=sheet.neighborhood_indices, neighborhood_width=3.0)
    sys.modules.update(modules)
    try:
        path.write_bytes(pickle.dumps(obj, protocol=4))
    finally:
        for name in names:
            del sys.modules[name]


@pytest.fixture(scope="module")
def tdann_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("tdann")
    state = resnet18_state()
    checkpoint = root / "simclr_swap" / "model_final_checkpoint_phase199.torch"
    checkpoint.parent.mkdir()
    torch.save(vissl_checkpoint(state), checkpoint)
    positions = root / "positions"
    positions.mkdir()
    build_sheet("layer4.1", (512, 7, 7), 70.0, 3.0, n_neighborhoods=8).save(positions / "layer4.1.npz")
    save_spacetorch_pickle(CorticalSheet("layer3.1", (256, 14, 14), retinotopic_positions((256, 14, 14), 22.4)),
                           positions / "layer3.1.pkl")
    return checkpoint, positions, state


@pytest.fixture(scope="module")
def tdann_model(tdann_files):
    checkpoint, positions, _ = tdann_files
    return load_tdann(checkpoint, positions)


def rgb_images(n=2, size=64, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


# --- TDANN loader ---------------------------------------------------------------------------------
def test_tdann_layers_areas_and_dims(tdann_model):
    model = tdann_model
    assert model.layers == ["layer3.1", "layer4.1"]
    assert model.resolve_layer("IT") == "layer4.1" and model.resolve_layer("V4") == "layer3.1"
    assert model.sheet("IT").dims == (512, 7, 7) and model.sheet("IT").n_units == 25_088
    assert model.sheet("V4").dims == (256, 14, 14)
    assert model.readout_layer == "layer4.1"
    assert model.architecture == {"family": "tdann_resnet18", "kwargs": {}}
    assert model.preprocessing == Preprocessing(224, 3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert len(set(TDANN_AREAS.values())) == len(TDANN_AREAS)  # every label names one layer
    assert model.metadata["checkpoint"]["sha256"] and set(model.metadata["positions"]) == {"layer3.1", "layer4.1"}


def test_tdann_activations_equal_plain_torchvision(tdann_files, tdann_model):
    _, _, state = tdann_files
    reference = torchvision.models.resnet18(weights=None)
    reference.load_state_dict(state)
    reference.eval()
    captured = {}
    reference.layer4[1].register_forward_hook(lambda m, i, o: captured.update(it=o.flatten(1)))
    images = rgb_images()
    with torch.no_grad():
        reference(tdann_model.preprocess(images))
    activations = tdann_model.activations(images, "IT")
    assert activations.shape == (2, 25_088)
    torch.testing.assert_close(activations, captured["it"], rtol=1e-5, atol=1e-5)


def test_tdann_subset_of_layers_and_area_override(tdann_files):
    checkpoint, positions, _ = tdann_files
    model = load_tdann(checkpoint, positions, layers=["layer4.1"], areas={"layer4.1": "VTC"}, name="tdann")
    assert model.layers == ["layer4.1"] and model.resolve_layer("VTC") == "layer4.1" and model.name == "tdann"
    with pytest.raises(FileNotFoundError, match="layer2.0"):
        load_tdann(checkpoint, positions, layers=["layer2.0"])
    with pytest.raises(ConfigError, match="TDANN layers"):
        load_tdann(checkpoint, positions, layers=["fc"])
    with pytest.raises(ConfigError, match="area labels must differ"):
        load_tdann(checkpoint, positions, areas={"layer3.1": "IT"})


def test_tdann_positions_are_checked(tdann_files, tmp_path):
    checkpoint, positions, _ = tdann_files
    bad = tmp_path / "positions"
    bad.mkdir()
    CorticalSheet("layer4.1", (512, 8, 8), np.zeros((512 * 64, 2))).save(bad / "layer4.1.npz")
    with pytest.raises(FileFormatError, match=r"\(512, 8, 8\).*\(512, 7, 7\)") as info:
        load_tdann(checkpoint, bad)
    assert info.value.path == bad / "layer4.1.npz"
    (bad / "layer4.1.pkl").write_bytes(b"")
    with pytest.raises(ConfigError, match="keep one"):
        load_tdann(checkpoint, bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no TDANN positions"):
        load_tdann(checkpoint, empty)


def test_vissl_trunk_from_standard_feature_blocks(tmp_path):
    state = {key: value for key, value in resnet18_state().items()}
    path = tmp_path / "vissl.torch"
    torch.save({"classy_state_dict": {"base_model": {"model": {"trunk": {
        f"_feature_blocks.{key}": value for key, value in state.items()}}}}}, path)
    trunk = read_vissl_trunk(path)
    assert set(trunk) == {key for key in state if not key.startswith("fc.")}
    torch.testing.assert_close(trunk["layer4.1.bn2.running_var"], state["layer4.1.bn2.running_var"])


class _Marker:
    """Unpickling this would create a marker file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _malformed(state, tmp_path):
    # every tensor a stride-0 view of one stored zero: right keys and shapes, tiny files
    light = {key: torch.zeros(1, dtype=value.dtype).expand(value.shape) if value.dim() else value
             for key, value in state.items()}
    trunk = vissl_checkpoint(light)["classy_state_dict"]["base_model"]["model"]["trunk"]
    missing = {k: v for k, v in trunk.items() if k != "base_model.layer2.0.conv1.weight"}
    wrong_shape = {**trunk, "base_model.layer2.0.conv1.weight": torch.zeros(128, 64, 5, 5)}
    alias_mismatch = {**trunk, "_feature_blocks.conv1.weight": torch.ones(64, 3, 7, 7)}

    def nest(t):
        return {"classy_state_dict": {"base_model": {"model": {"trunk": t}}}}

    return {
        "not_a_dict": ([torch.zeros(1)], "expected a dict"),
        "no_classy": ({"model": {}}, "no key 'classy_state_dict'"),
        "trunk_not_dict": (nest([1, 2]), "expected a state dict"),
        "missing_key": (nest(missing), "missing key.*layer2.0.conv1.weight"),
        "wrong_shape": (nest(wrong_shape), r"wrong shape.*layer2.0.conv1.weight \(128, 64, 5, 5\)"),
        "alias_mismatch": (nest(alias_mismatch), "does not match 'base_model.conv1.weight'"),
        "foreign_keys": (nest({**trunk, "head.weight": torch.zeros(1)}), "head.weight"),
        "unsafe": ({"classy_state_dict": _Marker(tmp_path / "marker")}, "never unpickles"),
    }


@pytest.mark.parametrize("case", ["not_a_dict", "no_classy", "trunk_not_dict", "missing_key", "wrong_shape",
                                  "alias_mismatch", "foreign_keys", "unsafe", "damaged"])
def test_malformed_checkpoints_are_refused(tdann_files, tmp_path, case):
    checkpoint, positions, state = tdann_files
    path = tmp_path / "bad.torch"
    if case == "damaged":
        path.write_bytes(checkpoint.read_bytes()[:5000])
        message = "not a readable torch checkpoint"
    else:
        content, message = _malformed(state, tmp_path)[case]
        torch.save(content, path)
    with pytest.raises(FileFormatError, match=message) as info:
        load_tdann(path, positions)
    assert info.value.path == path
    assert not (tmp_path / "marker").exists()


# --- model directories ------------------------------------------------------------------------------
def test_model_directory_round_trip_and_checksums(tdann_model, tmp_path):
    directory = tdann_model.save(tmp_path / "model")
    loaded = TopographicModel.load(directory)
    assert loaded.layers == tdann_model.layers and loaded.areas == tdann_model.areas
    assert loaded.architecture == {"family": "tdann_resnet18", "kwargs": {}}
    assert loaded.readout_layer == "layer4.1" and loaded.preprocessing == tdann_model.preprocessing
    np.testing.assert_allclose(loaded.sheet("IT").coordinates_mm, tdann_model.sheet("IT").coordinates_mm, rtol=1e-6)
    images = rgb_images(seed=3)
    assert torch.equal(loaded.activations(images, "V4"), tdann_model.activations(images, "V4"))
    weights = directory / "weights.pt"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(DataError, match="checksum mismatch for weights.pt"):
        TopographicModel.load(directory)


def test_activations_xarray_coords(tdann_model):
    images = rgb_images(seed=4)
    array = tdann_model.activations_xarray(images, "V4", stimulus_ids=["a", "b"])
    sheet = tdann_model.sheet("V4")
    assert array.dims == ("stimulus_id", "unit") and array.shape == (2, 256 * 14 * 14)
    assert list(array.stimulus_id.values) == ["a", "b"]
    np.testing.assert_array_equal(array.x_mm.values, sheet.coordinates_mm[:, 0])
    np.testing.assert_array_equal(array.y_mm.values, sheet.coordinates_mm[:, 1])
    np.testing.assert_array_equal(array.channel.values[[0, 196, 196 * 255]], [0, 1, 255])
    assert array.attrs["layer"] == "layer3.1"
    with pytest.raises(ValueError, match="stimulus_ids"):
        tdann_model.activations_xarray(images, "V4", stimulus_ids=["a"])
    # two images under one id: .sel(stimulus_id="a") gave both, as simulate refuses
    with pytest.raises(ValueError, match=r"stimulus_ids must be unique .*repeated: \['a'\]"):
        tdann_model.activations_xarray(images, "V4", stimulus_ids=["a", "a"])


def test_a_single_image_is_one_image_in_every_form(tdann_model, tmp_path):
    """One image given alone (an (H, W, 3) array, a (3, H, W) tensor, a file, a PIL image) has the activity it has in
    a list of one: it is one row, however small the batch (sliced as an array, its pixel rows would be images)."""
    from PIL import Image

    image = rgb_images(n=1, seed=6)[0]  # (64, 64, 3) uint8
    in_a_list = tdann_model.activations([image], "V4")
    Image.fromarray(image).save(tmp_path / "image.png")  # uint8, as the file holds it
    from_file = tdann_model.activations([tmp_path / "image.png"], "V4")
    for alone in (image, torch.from_numpy(image).permute(2, 0, 1)):
        np.testing.assert_allclose(tdann_model.activations(alone, "V4", batch_size=8), in_a_list, rtol=1e-5, atol=1e-6)
    for alone in (tmp_path / "image.png", Image.open(tmp_path / "image.png")):
        np.testing.assert_allclose(tdann_model.activations(alone, "V4"), from_file, rtol=1e-5, atol=1e-6)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match=f"batch_size must be an integer >= 1, got {bad!r}"):
            tdann_model.activations(image, "V4", batch_size=bad)
    with pytest.raises(ValueError, match=r"no images given \(None\)"):
        tdann_model.activations(None, "V4")


def test_activations_split_a_large_batch_of_large_images(tdann_model, monkeypatch):
    """``activations`` runs at most MAX_BATCH_PIXELS input pixels at a time whatever batch is asked for (at 224 px
    a batch of 512 peaked at 5 GB): with room for 3 images of the model's input size, 7 images asked in one batch
    of 512 run as 3 + 3 + 1 and give the activity they give one at a time; a batch below the limit is kept."""
    from stimsim.models import topographic

    size = tdann_model.preprocessing.size_px
    images = rgb_images(n=7, seed=5)
    one_by_one = tdann_model.activations(images, "V4", batch_size=1)
    batches = []
    run_stages = tdann_model.run_stages
    monkeypatch.setattr(tdann_model, "run_stages", lambda x, **kw: batches.append(len(x)) or run_stages(x, **kw))
    monkeypatch.setattr(topographic, "MAX_BATCH_PIXELS", 3 * size * size)
    np.testing.assert_allclose(tdann_model.activations(images, "V4", batch_size=512), one_by_one, rtol=1e-4, atol=1e-5)
    assert batches == [3, 3, 1]
    batches.clear()
    tdann_model.activations(images, "V4", batch_size=2)
    assert batches == [2, 2, 2, 1]


# --- preprocessing ------------------------------------------------------------------------------------
def test_preprocessing_accepts_every_image_kind(tmp_path):
    gray = np.full((20, 20), 128, dtype=np.uint8)
    red = np.zeros((20, 20, 3), dtype=np.uint8)
    red[..., 0] = 255
    Image.fromarray(gray).save(tmp_path / "gray.png")
    Image.fromarray(red).save(tmp_path / "red.png")
    to_gray = Preprocessing(size_px=16, channels=1, mean=(0.0,), std=(1.0,))
    expected = {"gray": 128 / 255, "red": 0.299}  # BT.601 luma of pure red
    inputs = {
        "paths": [tmp_path / "gray.png", str(tmp_path / "red.png")],
        "pil": [Image.open(tmp_path / "gray.png"), Image.open(tmp_path / "red.png")],
        "arrays": [gray, red],
        "float arrays": [gray / 255.0, red / 255.0],
        "tensor": torch.stack([torch.full((3, 20, 20), 128 / 255), torch.from_numpy(red / 255.0).permute(2, 0, 1)]),
        "uint8 tensor": torch.from_numpy(np.stack([np.repeat(gray[..., None], 3, -1), red])).permute(0, 3, 1, 2),
        "uint16 arrays": [gray.astype(np.uint16) * 257, red.astype(np.uint16) * 257],  # 65535 / 255 = 257
        "stimulus set": StimulusSet("two", [gray / 255.0, red / 255.0], np.array(["gray", "red"])),
    }
    for kind, images in inputs.items():
        out = to_gray(images)
        assert out.shape == (2, 1, 16, 16), kind
        torch.testing.assert_close(out[0], torch.full((1, 16, 16), expected["gray"]), atol=1e-5, rtol=0, msg=kind)
        torch.testing.assert_close(out[1], torch.full((1, 16, 16), expected["red"]), atol=1e-5, rtol=0, msg=kind)
    rgb = Preprocessing(size_px=16)(tmp_path / "gray.png")  # gray repeated into RGB, ImageNet-normalised
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    torch.testing.assert_close(rgb[0, :, 0, 0], (128 / 255 - mean) / std)
    keep = Preprocessing(size_px=20, channels=1, mean=(0.0,), std=(1.0,))
    assert keep(gray).shape == (1, 1, 20, 20)
    assert keep(np.stack([gray, gray])).shape == (2, 1, 20, 20)


def test_preprocessing_resizes_mixed_sizes_and_rejects_bad_input(tmp_path):
    out = Preprocessing(size_px=32)([np.zeros((10, 10), np.uint8), np.zeros((40, 30, 3), np.uint8)])
    assert out.shape == (2, 3, 32, 32)
    (tmp_path / "not_an_image.png").write_text("hello")
    with pytest.raises(FileFormatError, match="cannot decode image"):
        Preprocessing()(tmp_path / "not_an_image.png")
    with pytest.raises(FileNotFoundError):
        Preprocessing()(tmp_path / "absent.png")
    with pytest.raises(ConfigError, match="channels"):
        Preprocessing(channels=2)
    with pytest.raises(ConfigError, match="mean"):
        Preprocessing(channels=1)
    with pytest.raises(ConfigError, match="unknown preprocessing"):
        Preprocessing.from_dict({"size": 32})
    # values the network would read on another scale than [0, 1] are refused, not clamped or passed on
    eight_bit = np.full((2, 20, 20), 200.0, np.float32)
    for images, message in ((eight_bit, r"values in \[0, 1\], got values from 200 to 200 \(8-bit values as floats"),
                            (torch.from_numpy(eight_bit[:, None]), "values in \\[0, 1\\]"),
                            ([np.full((20, 20), np.nan, np.float32)], "NaN or infinite"),
                            (np.ones((2, 20, 20), np.int64), "images of type int64"),
                            (torch.zeros(2, 2, 20, 20), r"C = 1, 3 or 4 \(channels first\), got shape \(2, 2, 20"),
                            (torch.zeros(0, 3, 20, 20), "no images given"), ([], "no images given")):
        with pytest.raises(ValueError, match=message):
            Preprocessing(size_px=16)(images)


def test_preprocessing_refuses_settings_that_would_feed_the_network_nan_or_another_size():
    # a NaN mean or an infinite std turns every input pixel into NaN or 0: refused, naming the key and its value
    for kwargs, message in ((dict(mean=(float("nan"),)), r"mean must be 1 finite number\(s\).*got \(nan,\)"),
                            (dict(std=(float("inf"),)), r"std must be 1 finite number\(s\).*got \(inf,\)"),
                            (dict(mean="0.5"), "mean must be 1 finite"), (dict(size_px=32.5), "integer.*got 32.5"),
                            (dict(size_px="32"), "integer.*got '32'"), (dict(std=(0.0,)), "std values must be > 0")):
        with pytest.raises(ConfigError, match=message):
            Preprocessing(**{"size_px": 16, "channels": 1, "mean": (0.5,), "std": (0.5,), **kwargs})
    assert Preprocessing(size_px=np.int64(16), channels=1, mean=np.array([0.5]), std=[0.25]).mean == (0.5,)


def test_preprocessing_refuses_images_without_pixels_and_objects_that_are_not_images():
    preprocessing = Preprocessing(size_px=16, channels=1, mean=(0.5,), std=(0.5,))
    for images in (np.zeros((2, 5, 0), np.float32), torch.zeros(2, 1, 0, 4), [np.zeros((3, 0, 3), np.float32)]):
        with pytest.raises(ValueError, match=r"at least 1 × 1 px, got \d+ × 0 px|got 0 × \d+ px"):
            preprocessing(images)
    for images in (5, {"a": np.zeros((4, 4))}, (image for image in [np.zeros((4, 4))])):
        with pytest.raises(TypeError, match=f"images must be an image .* got {type(images).__name__}"):
            preprocessing(images)


def test_preprocessing_keeps_the_aspect_and_cuts_out_the_centre():
    """A 20 × 40 image, white but for its 5 leftmost and 5 rightmost columns: resized so its shorter
    side is 8 px (8 × 16, the square cut out is columns 10-30 of the original), it is white; squeezing
    the whole width into 8 px, as a plain resize would, turns the outer columns black."""
    wide = np.zeros((20, 40), np.uint8)
    wide[:, 5:35] = 255
    out = Preprocessing(size_px=8, channels=1, mean=(0.0,), std=(1.0,))(wide)
    assert out.shape == (1, 1, 8, 8)
    torch.testing.assert_close(out, torch.ones(1, 1, 8, 8), atol=1e-6, rtol=0)
    tall = Preprocessing(size_px=8, channels=1, mean=(0.0,), std=(1.0,))(wide.T.copy())
    torch.testing.assert_close(tall, torch.ones(1, 1, 8, 8), atol=1e-6, rtol=0)
    mixed = Preprocessing(size_px=8, channels=1, mean=(0.0,), std=(1.0,))([wide, np.full((10, 10), 255, np.uint8)])
    torch.testing.assert_close(mixed, torch.ones(2, 1, 8, 8), atol=1e-6, rtol=0)


def test_each_image_reaches_the_network_as_if_it_were_alone():
    """A 25 px image's input is the bilinear, antialiased resize of it to the model's 32 px and nothing
    else, whether it is preprocessed alone, after a 28 px and before a 64 px image, or in batches of
    one, and in its place when another 25 px image shares its resize: had the call brought its images
    to a common size first, the 25 px image would be resized twice (25 → 28 → 32) beside the others and
    once alone."""
    from stimsim.models.registry import load_model

    model = load_model("stimsim-topo-s0")
    size_px = model.preprocessing.size_px
    rng = np.random.default_rng(0)
    a, b, c = (rng.random((n, n)).astype(np.float32) for n in (25, 28, 64))
    direct = torch.nn.functional.interpolate(torch.from_numpy(a)[None, None], size=(size_px, size_px),
                                             mode="bilinear", align_corners=False, antialias=True)
    mean, std = model.preprocessing.mean[0], model.preprocessing.std[0]
    torch.testing.assert_close(model.preprocess([a]), (direct.clamp(0, 1) - mean) / std, atol=1e-6, rtol=0)
    torch.testing.assert_close(model.preprocess([b, a, c])[1], model.preprocess([a])[0], atol=0, rtol=0)
    a_other = rng.random((25, 25)).astype(np.float32)  # two images of one size share a resize call
    together = model.preprocess([a, b, a_other, c])
    for row, image in enumerate((a, b, a_other, c)):
        torch.testing.assert_close(together[row], model.preprocess([image])[0], atol=0, rtol=0)
    np.testing.assert_array_equal(model.preprocessing.geometry([b, a, c])[1], model.preprocessing.geometry([a])[0])
    alone = model.activations([a], "IT")[0]
    for images, batch_size, row in (([b, a, c], 64, 1), ([b, a, c], 1, 1), ([c, b, a], 2, 2)):
        torch.testing.assert_close(model.activations(images, "IT", batch_size=batch_size)[row], alone,
                                   atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        expected = model.run_stages((direct.clamp(0, 1) - mean) / std, stop="IT").flatten(1)[0]
    torch.testing.assert_close(alone, expected, atol=1e-5, rtol=1e-5)


def test_geometry_is_the_network_input_before_normalisation_with_colour_explicit():
    """Uniform colour (R, G, B) = (0.2, 0.4, 0.6) has BT.601 luma 0.299·0.2 + 0.587·0.4 + 0.114·0.6 = 0.363 for a
    gray model, alpha ignored; a gray image is repeated on the three channels of an RGB model; a wide image
    loses its sides; normalising the geometry gives exactly what the model's preprocessing gives."""
    gray_model = Preprocessing(size_px=16, channels=1, mean=(0.5,), std=(0.25,))
    rgb_model = Preprocessing(size_px=16)
    colour = np.empty((20, 30, 3), np.float32)
    colour[...] = (0.2, 0.4, 0.6)
    rgba = np.concatenate([(colour * 255).round().astype(np.uint8), np.zeros((20, 30, 1), np.uint8)], axis=-1)
    luma, luma_rgba = gray_model.geometry([colour, rgba])
    assert luma.shape == (16, 16) and luma.dtype == np.float32
    np.testing.assert_allclose(luma, 0.363, atol=1e-6)
    np.testing.assert_allclose(luma_rgba, (0.299 * 51 + 0.587 * 102 + 0.114 * 153) / 255, atol=1e-6)
    [repeated] = rgb_model.geometry(np.full((24, 24), 0.7, np.float32))
    assert repeated.shape == (16, 16, 3)
    np.testing.assert_allclose(repeated, 0.7, atol=1e-6)
    wide = np.zeros((20, 40), np.uint8)
    wide[:, 5:35] = 255  # the black outer columns lie outside the centre square
    [cropped] = gray_model.geometry(wide)
    assert cropped.min() > 0.999
    for image in (colour, rgba, wide):
        normalised = (torch.from_numpy(gray_model.geometry([image])[0]) - 0.5) / 0.25
        torch.testing.assert_close(gray_model([image])[0, 0], normalised, atol=0, rtol=0)
    assert [a.shape for a in gray_model.geometry([np.zeros((10, 10)), np.zeros((40, 30, 3))])] == [(16, 16)] * 2
    assert gray_model.geometry(torch.zeros(3, 1, 8, 8))[2].shape == (16, 16)


@pytest.mark.skipif(not MOELLER_FACES.is_dir(), reason="real stimulus images not available")
def test_preprocessing_real_stimulus_images():
    paths = sorted(MOELLER_FACES.iterdir())[:3]
    out = Preprocessing(size_px=64, channels=1, mean=(0.0,), std=(1.0,))(paths)
    assert out.shape == (3, 1, 64, 64)
    assert 0.0 <= out.min() and out.max() <= 1.0 and out.std() > 0.05


# --- torchvision builder ------------------------------------------------------------------------------
SMALL = Preprocessing(size_px=64)


def test_torchvision_resnet18_from_a_state_dict_file(tmp_path):
    state = resnet18_state()
    torch.save(state, tmp_path / "resnet18.pt")
    layers = {"layer4.1": {"sheet_size_mm": 10.0, "neighborhood_width_mm": 2.0, "area": "IT"},
              "layer3.1": {"sheet_size_mm": 8.0, "neighborhood_width_mm": 2.0, "area": "V4", "n_neighborhoods": 16}}
    model = build_torchvision_model("resnet18", tmp_path / "resnet18.pt", layers, SMALL)
    assert model.layers == ["layer3.1", "layer4.1"] and model.readout_layer == "layer4.1"
    assert model.sheet("IT").dims == (512, 2, 2) and model.sheet("V4").dims == (256, 4, 4)
    assert model.sheet("V4").neighborhood_indices.shape[0] == 16
    x0, x1, y0, y1 = model.sheet("IT").extent_mm
    assert 0 <= x0 and x1 <= 10 and 0 <= y0 and y1 <= 10
    reference = torchvision.models.resnet18(weights=None)
    reference.load_state_dict(state)
    images = rgb_images(seed=5)
    with torch.no_grad():
        logits = reference.eval()(SMALL(images))
    torch.testing.assert_close(model.run_stages(SMALL(images)), logits)
    saved = TopographicModel.load(model.save(tmp_path / "model"))
    assert torch.equal(saved.activations(images, "IT"), model.activations(images, "IT"))
    assert saved.architecture == {"family": "torchvision", "kwargs": {"arch": "resnet18"}}
    # old checkpoints without BatchNorm counters load too
    old_style = {key: value for key, value in state.items() if not key.endswith("num_batches_tracked")}
    model = build_torchvision_model("resnet18", old_style, {"layer4.1": layers["layer4.1"]}, SMALL)
    assert torch.equal(model.activations(images, "IT"), saved.activations(images, "IT"))


def test_torchvision_alexnet_with_swap_optimised_positions():
    images = rgb_images(n=4, seed=6)
    layers = {"features.10": {"sheet_size_mm": 10.0, "neighborhood_width_mm": 3.0, "area": "IT",
                              "n_neighborhoods": 16}}
    plain = build_torchvision_model("alexnet", None, layers, SMALL, seed=1)
    state = torch.random.get_rng_state()
    again = build_torchvision_model("alexnet", None, layers, SMALL, seed=1)  # seeded init, global RNG untouched
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(again.activations(images, "IT"), plain.activations(images, "IT"))
    swapped = build_torchvision_model("alexnet", plain.network.state_dict(), layers, SMALL, seed=1,
                                      swap_images=images, swap_steps=20)
    sheet, before = swapped.sheet("IT"), plain.sheet("IT")
    assert sheet.dims == (256, 3, 3)
    np.testing.assert_array_equal(np.sort(sheet.coordinates_mm, axis=0), np.sort(before.coordinates_mm, axis=0))
    expected, history = swap_optimize(before, plain.activations(images, "IT"), 20, seed=1)
    np.testing.assert_array_equal(sheet.coordinates_mm, expected.coordinates_mm)
    losses = swapped.metadata["swap_spatial_loss"]["features.10"]
    assert losses["final"] == pytest.approx(history[-1]) and losses["final"] < losses["initial"]


def test_torchvision_builder_errors(tmp_path):
    layer = {"layer4.1": {"sheet_size_mm": 10.0, "neighborhood_width_mm": 2.0}}
    state = resnet18_state()
    renamed = {("module." + k if k.startswith("fc.") else k): v for k, v in state.items()}
    with pytest.raises(ConfigError, match=r"2 missing key\(s\): fc.weight, fc.bias.*unexpected.*module.fc"):
        build_torchvision_model("resnet18", renamed, layer, SMALL)
    torch.save(renamed, tmp_path / "renamed.pt")
    with pytest.raises(FileFormatError, match="missing key") as info:
        build_torchvision_model("resnet18", tmp_path / "renamed.pt", layer, SMALL)
    assert info.value.path == tmp_path / "renamed.pt"
    with pytest.raises(ConfigError, match="not stages of resnet18"):
        build_torchvision_model("resnet18", None, {"layer9": layer["layer4.1"]}, SMALL)
    with pytest.raises(ConfigError, match="unknown sheet spec key"):
        build_torchvision_model("resnet18", None, {"layer4.1": {**layer["layer4.1"], "size_mm": 3}}, SMALL)
    with pytest.raises(ConfigError, match="lacks"):
        build_torchvision_model("resnet18", None, {"layer4.1": {"sheet_size_mm": 10.0}}, SMALL)
    with pytest.raises(ConfigError, match="swap_images"):
        build_torchvision_model("resnet18", None, layer, SMALL, swap_steps=5)
    with pytest.raises(ConfigError, match="unknown torchvision architecture"):
        build_torchvision_model("resnet1000", None, layer, SMALL)
    with pytest.raises(ConfigError, match="channels must be 3"):
        build_torchvision_model("resnet18", None, layer, Preprocessing(size_px=64, channels=1, mean=(0.5,), std=(0.5,)))


class _PooledIT(torch.nn.Module):
    """A small network whose IT reads pooled convolutional features (units 0.. of a Linear + ReLU)."""

    def __init__(self, units: int = 16):
        super().__init__()
        self.stem = torch.nn.Conv2d(1, 4, 3)
        self.it = torch.nn.Linear(4, units)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        return self.relu(self.it(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.stem(x), 1), 1)))


def _pooled_it_model(spacing_mm: float, area: str = "IT") -> TopographicModel:
    torch.manual_seed(0)
    side = 4
    grid = np.stack(np.meshgrid(np.arange(side), np.arange(side)), -1).reshape(-1, 2) * spacing_mm
    sheet = CorticalSheet("it", (side * side, 1, 1), grid.astype(float))
    return TopographicModel(_PooledIT(side * side), {"it": sheet}, Preprocessing(size_px=16, channels=1, mean=(0.5,),
                                                                                 std=(0.5,)),
                            {"family": "test_pooled_it", "kwargs": {}}, areas={"it": area}, name="pooled-it")


def test_models_check_explains_a_sheet_too_sparse_or_images_too_alike_for_its_maps():
    from stimsim.training.evaluation import check_model

    with pytest.raises(ConfigError, match=r"pooled-it: models check measures the layer labelled as area 'IT', and none "
                                          r"of this model's layers is \(areas: \{'it': 'V4'\}\)"):
        check_model(_pooled_it_model(0.5, area="V4"), n_shuffles=100, imagenet=False)
    # units 1.5 mm apart: Moran's I among units within 1 mm has no pair to compare
    with pytest.raises(ConfigError, match=r"pooled-it: models check measures clustering among units within 1 model mm "
                                          r"of each other, and no two units of its it sheet are that close \(the nearest "
                                          r"pair is 1.5 mm apart\)"):
        check_model(_pooled_it_model(1.5), n_shuffles=100, imagenet=False)
    # every 'face' image the same blank field, every other image the same bright one: a unit's d' is ±inf
    images = [np.full((16, 16), 0.2, np.float32)] * 5 + [np.full((16, 16), 0.9, np.float32)] * 5
    same = StimulusSet("same-images", images, np.array([f"s{i}" for i in range(10)]),
                       {"category": np.array(["face"] * 5 + ["house"] * 5)})
    with pytest.raises(ConfigError, match=r"stimulus set 'same-images': \d+ units of it respond the same to every image "
                                          r"with category = 'face' and the same to every other image"):
        check_model(_pooled_it_model(0.5), n_shuffles=100, imagenet=False, stimuli=same)

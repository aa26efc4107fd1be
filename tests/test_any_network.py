"""Any network, not only chains: torch.fx stages (MobileNetV2 end to end, a user's own network with
functional calls and a skip connection) and architecture families registered through entry points."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from stimsim.behavior import LogisticDecoder
from stimsim.cortex.positions import retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.data.stimuli import lfw_subset
from stimsim.engine import simulate, simulate_plain
from stimsim.models.architectures import MODEL_FAMILIES, register_family
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.stages import split_network
from stimsim.models.topographic import TopographicModel
from stimsim.models.torchvision_builder import build_torchvision_model
from stimsim.paradigms import load_results, parse_experiment, run_experiment
from stimsim.stimulation import Condition, ElectricalStimulation
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def mobilenet():
    """Torchvision's MobileNetV2 (random weights, 32 px input): IT = ``features.17`` (320 × 1 × 1)."""
    layers = {"features.17": {"sheet_size_mm": 8.0, "neighborhood_width_mm": 2.0, "area": "IT",
                              "n_neighborhoods": 8}}
    return build_torchvision_model("mobilenet_v2", None, layers, Preprocessing(size_px=32), seed=0)


def test_mobilenet_v2_stages_are_its_module_names_and_reproduce_its_forward(mobilenet):
    # MobileNetV2 pools with a functional call between ``features`` and ``classifier``
    names = mobilenet.stage_names
    assert names[:2] == ["features.0", "features.1"] and names[-3:] == ["features.18", "classifier.0", "classifier.1"]
    assert mobilenet.sheet("IT").dims == (320, 1, 1)
    x = mobilenet.preprocess(np.random.default_rng(0).uniform(0, 1, (3, 32, 32, 3)))
    with torch.no_grad():
        expected = mobilenet.network(x)
    torch.testing.assert_close(mobilenet.run_stages(x), expected, rtol=0, atol=0)
    after = mobilenet.run_stages(mobilenet.run_stages(x, stop="IT"), start="IT")
    torch.testing.assert_close(after, expected, rtol=0, atol=0)


def test_mobilenet_v2_engine_matches_a_hook_on_the_whole_network(mobilenet):
    images = lfw_subset().images[::25]
    features = mobilenet.activations(images, "features.18")
    decoder = LogisticDecoder.fit(features, ["face"] * 4 + ["nonface"] * 4, layer="features.18")
    stim = ElectricalStimulation(sites_mm=((4.0, 4.0),), current_uA=100, frequency_Hz=200, pulse_width_ms=0.2,
                                 train_ms=50, layer="IT")
    silent = ElectricalStimulation(sites_mm=((4.0, 4.0),), current_uA=100, frequency_Hz=0, pulse_width_ms=0.2,
                                   train_ms=50, layer="IT")
    conditions = [Condition("control"), Condition("stim", (stim,)), Condition("0 Hz", (silent,))]
    fast = simulate(mobilenet, images, conditions, decoder, progress=False)
    plain = simulate_plain(mobilenet, images, conditions, decoder, progress=False)
    np.testing.assert_allclose(fast.values, plain.values, rtol=0, atol=1e-5)
    # a nil effect reproduces the unperturbed output exactly; 100 µA at 200 Hz changes the choices
    np.testing.assert_array_equal(fast.sel(condition="0 Hz").values, fast.sel(condition="control").values)
    assert np.abs(fast.sel(condition="stim").values - fast.sel(condition="control").values).max() > 1e-4


def test_mobilenet_v2_runs_an_afraz2006_style_experiment_end_to_end(mobilenet, tmp_path):
    raw = load_toml(REPO / "experiments" / "afraz2006.toml")
    raw["model"] = "mobilenet_v2"
    raw["stimuli"].update(sets=[{"source": "lfw_subset"}], label="category", n_per_choice=6)
    raw["stimuli"]["noise"]["signal_percent"] = [0, 50, 100]
    raw["sites"] = {"method": "explicit", "sites_mm": [[2.0, 2.0], [4.0, 4.0], [6.0, 3.0]],
                    "groups": ["a", "b", "b"], "recording_radius_mm": 2.0}
    raw["analysis"].update(n_boot=10, n_perm=10)
    spec = parse_experiment(raw, where="afraz2006-mobilenet")
    # features.17 ends with a BatchNorm, no ReLU: its activity is signed, and a gain there is flagged once
    with pytest.warns(UserWarning, match="gain > 1") as warned:
        summary = run_experiment(spec, tmp_path, model=mobilenet, progress=False)
    assert len([w for w in warned if "gain > 1" in str(w.message)]) == 1
    dataset, stored, config = load_results(tmp_path)
    assert sum("gain > 1" in note for note in config["notes"]) == 1
    assert stored == summary and summary["model"] == "mobilenet_v2" and summary["layer"] == "features.17"
    assert summary["n_sites"] == 3 and summary["n_test_images"] == 18  # 6 + 6 images, half tested, 3 levels
    assert dataset["choice_probability"].sizes == {"condition": 4, "stimulus_id": 18, "choice": 2}
    assert dataset["current_uA"].values[1:].tolist() == [50.0] * 3
    assert dataset["psychometric_shift_percent"].sizes == {"site": 3}
    assert (tmp_path / "psychometric.png").is_file() and (tmp_path / "sites.png").is_file()
    if SHARED_DATA.is_dir():
        assert summary["data_n_sites"] == 86 and (tmp_path / "afraz2006_comparison.png").is_file()


class LabNet(nn.Module):
    """A user's own network: a residual connection and pooling in its forward, not in modules."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.it = nn.Linear(8, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.head(torch.relu(self.it(x)))


def test_own_network_splits_where_nothing_passes_around_the_layer():
    torch.manual_seed(0)
    net = LabNet().eval()
    stages = split_network(net, torch.zeros(2, 1, 16, 16), layers=["it"])
    # Sequential children are opened; the skip connection is computed in the stage of the module after it
    assert [name for name, _ in stages] == ["stem.0", "stem.1", "it", "head"]
    with pytest.raises(ConfigError, match=r"'block'.*skip connection passes around it"):
        split_network(net, torch.zeros(2, 1, 16, 16), layers=["block"])
    with pytest.raises(ConfigError, match=r"\['blok'\] are not modules of LabNet"):
        split_network(net, torch.zeros(2, 1, 16, 16), layers=["blok"])
    sheet = CorticalSheet("it", (16, 1, 1), retinotopic_positions((16, 1, 1), 4.0, seed=0))
    model = TopographicModel(net, {"it": sheet}, Preprocessing(size_px=16, channels=1, mean=(0.5,), std=(0.5,)),
                             {"family": "lab_net", "kwargs": {}}, areas={"it": "IT"})
    images = np.random.default_rng(1).uniform(0, 1, (4, 16, 16))
    with torch.no_grad():
        stem = net.stem(model.preprocess(images))
        # a layer's activity is its module's output: here before the functional ReLU
        expected = net.it(torch.flatten(nn.functional.adaptive_avg_pool2d(stem + net.block(stem), 1), 1))
    torch.testing.assert_close(model.activations(images, "IT"), expected)


def test_own_family_registered_by_entry_point_loads_in_another_process(tmp_path):
    """A lab's package declares ``stimsim.model_families: lab_net = lab_nets:LabNet``; a model directory
    saved with that family loads in a fresh Python process without any import by the user."""
    package = tmp_path / "site"
    package.mkdir()
    (package / "lab_nets.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn

        class LabNet(nn.Module):
            def __init__(self, width=8):
                super().__init__()
                self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU())
                self.it = nn.Linear(width, 16)
                self.head = nn.Linear(16, 2)

            def forward(self, x):
                x = torch.flatten(nn.functional.adaptive_avg_pool2d(self.stem(x), 1), 1)
                return self.head(torch.relu(self.it(x)))
    '''))
    dist_info = package / "lab_nets-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-nets\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[stimsim.model_families]\nlab_net = lab_nets:LabNet\n")
    sys.path.insert(0, str(package))
    try:
        import lab_nets

        torch.manual_seed(0)
        net = lab_nets.LabNet(width=6)
        sheet = CorticalSheet("it", (16, 1, 1), retinotopic_positions((16, 1, 1), 4.0, seed=0))
        model = TopographicModel(net, {"it": sheet}, Preprocessing(size_px=16, channels=1, mean=(0.5,), std=(0.5,)),
                                 {"family": "lab_net", "kwargs": {"width": 6}}, areas={"it": "IT"}, name="lab")
        # saving rebuilds the network from its family, which this process found no entry point for (its packages
        # were read before the site existed): the lab registers it here; the fresh process below only imports stimsim
        with pytest.raises(ConfigError, match=r"model.json \[architecture\]: unknown architecture family 'lab_net'"):
            model.save(tmp_path / "model")
        register_family("lab_net", lab_nets.LabNet)
        try:
            model.save(tmp_path / "model")
        finally:
            MODEL_FAMILIES.unregister("lab_net")
        images = np.random.default_rng(2).uniform(0, 1, (3, 16, 16))
        np.save(tmp_path / "images.npy", images)
        expected = model.activations(images, "IT").numpy()
    finally:
        sys.path.remove(str(package))
        sys.modules.pop("lab_nets", None)
    script = ("import sys, json, numpy as np; from stimsim.models.registry import load_model; "
              "m = load_model(sys.argv[1]); a = m.activations(np.load(sys.argv[2]), 'IT').numpy(); "
              "print(json.dumps({'name': m.name, 'stages': m.stage_names, 'activity': a.tolist()}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "model"), str(tmp_path / "images.npy")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["name"] == "lab" and result["stages"] == ["stem.0", "stem.1", "it", "head"]
    np.testing.assert_array_equal(np.array(result["activity"], dtype=np.float32), expected)


class _TwoOutputs(nn.Module):
    def __init__(self, fill=None):
        super().__init__()
        self.it = nn.Linear(4, 3)
        self.fill = fill

    def forward(self, x):
        out = self.it(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 2), 1))
        return (out, out) if self.fill is None else out * self.fill


@pytest.mark.parametrize("fill, message", [
    (None, r"_TwoOutputs: its forward pass returns tuple; stimsim needs one tensor"),
    (float("nan"), r"_TwoOutputs: its forward pass gives values that are not finite"),
])
def test_a_network_whose_output_is_not_one_finite_tensor_is_named(fill, message):
    with pytest.raises(ConfigError, match=message):
        split_network(_TwoOutputs(fill).eval(), torch.zeros(2, 1, 8, 8), layers=["it"])


def test_a_network_that_refuses_the_preprocessings_images_is_named_with_the_input_shape():
    """A one-channel network given three-channel images (a preprocessing with channels = 3) fails in its first
    layer: one error naming the network, the images' shape and torch's own reason, no traceback."""
    network = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2)).eval()
    network(torch.zeros(1, 1, 8, 8))  # sizes the lazy layer
    with pytest.raises(ConfigError, match=r"Sequential: its forward pass fails on images of 3 × 8 × 8 \(channels × "
                                          r"height × width.*RuntimeError: .*expected input.* to have 1 channels"):
        split_network(network, torch.zeros(2, 3, 8, 8), layers=["1"])

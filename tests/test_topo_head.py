"""The topo_head family (a topographic IT on an ImageNet trunk) and its build from a file."""
from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch
from PIL import Image

from stimsim.cortex.sheet import CorticalSheet
from stimsim.cortex.topography import selective_clusters_mm
from stimsim.models.topo_head import TopoHeadNet
from stimsim.models.topographic import TopographicModel
from stimsim.training.head_config import load_head_config
from stimsim.training.head_training import build_topo_head_model


def test_network_shapes_and_non_negative_it():
    torch.manual_seed(0)
    network = TopoHeadNet("mobilenet_v2", it_units=64, it_rank=8, head_rank=8, n_domains=3).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        logits = network(x)
        it = network.it(network.pool(network.trunk(x)))
    assert logits.shape == (2, 1000)
    assert it.shape == (2, 64) and float(it.min()) >= 0.0
    assert network.domain_head.out_features == 3


@pytest.mark.parametrize("key, value", [("it_units", 1), ("it_rank", 0), ("n_domains", -1), ("it_units", 2.5)])
def test_network_refuses_bad_sizes(key, value):
    from stimsim.utilities.errors import ConfigError

    with pytest.raises(ConfigError, match=key):
        TopoHeadNet("mobilenet_v2", **{key: value})


def test_unknown_base_network_lists_the_known():
    from stimsim.utilities.errors import ConfigError

    with pytest.raises(ConfigError, match="mobilenet_v2"):
        TopoHeadNet("resnet9000")


def test_cluster_size_of_a_disc():
    """A map that is 3 inside a disc of radius 1 mm and 0 outside has one cluster about 2 mm across: the
    smoothed map crosses the threshold 1 (a third of the step) just outside the disc's edge, here within
    0.1 mm for σ = 0.1 mm."""
    xs, ys = np.meshgrid(np.arange(0, 6, 0.05), np.arange(0, 6, 0.05))
    coords = np.stack([xs.ravel(), ys.ravel()], 1)
    values = np.where(np.hypot(coords[:, 0] - 3, coords[:, 1] - 3) < 1.0, 3.0, 0.0)
    sheet = CorticalSheet("it", (len(coords), 1, 1), coords)
    clusters = selective_clusters_mm(values, sheet, threshold=1.0, sigma_mm=0.1, grid_step_mm=0.05)
    assert len(clusters) == 1
    assert clusters[0] == pytest.approx(2.0, abs=0.1)


def test_two_discs_are_two_clusters_largest_first():
    xs, ys = np.meshgrid(np.arange(0, 10, 0.1), np.arange(0, 10, 0.1))
    coords = np.stack([xs.ravel(), ys.ravel()], 1)
    big = np.hypot(coords[:, 0] - 3, coords[:, 1] - 3) < 1.5
    small = np.hypot(coords[:, 0] - 8, coords[:, 1] - 8) < 0.75
    sheet = CorticalSheet("it", (len(coords), 1, 1), coords)
    clusters = selective_clusters_mm(np.where(big | small, 2.0, 0.0), sheet, sigma_mm=0.1, grid_step_mm=0.05)
    assert len(clusters) == 2 and clusters[0] > clusters[1]
    assert clusters[0] == pytest.approx(3.0, abs=0.15) and clusters[1] == pytest.approx(1.5, abs=0.15)


def _write_images(root, n_per_class=6):
    """Two classes of 40 px images: bright discs ('adult', a face stand-in) and dark squares ('car')."""
    rng = np.random.default_rng(0)
    for category in ("adult", "car"):
        (root / category).mkdir(parents=True)
        for i in range(n_per_class):
            image = rng.uniform(0.3, 0.5, (40, 40))
            yy, xx = np.mgrid[:40, :40]
            if category == "adult":
                image[np.hypot(yy - 20, xx - 20) < 12] = 0.95
            else:
                image[8:32, 8:32] = 0.05
            Image.fromarray((image * 255).astype(np.uint8)).save(root / category / f"{category}-{i}.png")


def _config(tmp_path, steps=6, storage="float16", extra_model="", extra_training="", readout="readout_steps = 3",
            extra_tables=""):
    _write_images(tmp_path / "images")
    path = tmp_path / "build.toml"
    path.write_text(f"""
name = "tiny-head"
[model]
base_network = "mobilenet_v2"
base_weights = "random"
grid_side = 16
trained_grid_side = 8
it_rank = 8
head_rank = 8
sheet_size_mm = 4.0
neighborhood_width_mm = 2.0
n_neighborhoods = 8
max_neighborhood_units = 32
storage = "{storage}"
preprocessing = {{ size_px = 32 }}
{extra_model}
[data]
sets = [{{ source = "folder", path = "images", holdout_fraction = 0.25 }}]
views = 2
[data.domains]
face = ["adult"]
object = ["car"]
[training]
steps = {steps}
batch_size = 6
neighborhoods_per_step = 2
checkpoint_every_steps = 2
{readout}
{extra_training}
[cortex_scale]
rule = "a fixed scale, for the test"
cortex_mm_per_model_mm = 2.5
{extra_tables}
""")
    return path


def test_build_is_deterministic_resumable_and_loads(tmp_path):
    torch.set_num_threads(1)
    config = _config(tmp_path)
    whole = build_topo_head_model(config, tmp_path / "whole", progress=False)
    build_topo_head_model(config, tmp_path / "resumed", progress=False, stop_after_step=3)
    assert not (tmp_path / "resumed" / "model").exists()
    resumed = build_topo_head_model(config, tmp_path / "resumed", progress=False)
    assert (whole / "weights.pt").read_bytes() == (resumed / "weights.pt").read_bytes()

    model = TopographicModel.load(whole)
    assert model.architecture["family"] == "topo_head"
    assert model.cortex_scale("IT")["cortex_mm_per_model_mm"] == 2.5
    # 3 of 12 images held out (25 % of each class), and recorded for experiments
    assert len(model.metadata["holdout_stimulus_ids"]) == 4
    assert model.sheet("IT").n_units == 16 * 16
    assert model.metadata["domains"] == ["face", "object"]
    saved = torch.load(whole / "weights.pt", weights_only=True)
    assert saved["it.1.weight"].dtype == torch.float16
    # the model that was measured is the one that was saved: its weights are float16 values
    weight = model.network.it[1].weight
    assert torch.equal(weight, weight.half().float())


def test_a_build_storing_the_trained_grid_has_the_same_units_in_a_smaller_file(tmp_path):
    torch.set_num_threads(1)
    per_unit = build_topo_head_model(_config(tmp_path / "a"), tmp_path / "a" / "out", progress=False)
    grid = build_topo_head_model(_config(tmp_path / "b", extra_model='it_weights = "trained_grid"'),
                                 tmp_path / "b" / "out", progress=False)
    stored = torch.load(grid / "weights.pt", weights_only=True)
    # the trained 8 x 8 grid's weights, not the 16 x 16 units'
    assert stored["it.1.weight"].shape == (64, 8) and stored["it.1.bias"].shape == (64,)
    assert torch.load(per_unit / "weights.pt", weights_only=True)["it.1.weight"].shape == (256, 8)
    a, b = TopographicModel.load(per_unit), TopographicModel.load(grid)
    assert b.architecture["kwargs"]["it_grid_side"] == 8 and "it_grid_side" not in a.architecture["kwargs"]
    images = np.random.default_rng(0).random((3, 32, 32, 3)).astype(np.float32)
    # the same IT up to float16 rounding (of the interpolated weights in one, of the grid's in the other)
    np.testing.assert_allclose(b.activations(images, "IT").numpy(), a.activations(images, "IT").numpy(),
                               rtol=0, atol=2e-3 * float(a.activations(images, "IT").abs().max()))


def test_sampled_features_follow_the_cached_features_and_reach_the_build(tmp_path):
    from stimsim.training.trunk_features import FeatureSampler

    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(3, 3))
    features = (rng.normal(size=(2, 4000, 3)) @ mixing.T + 5.0).astype(np.float32)  # far from 0: no clipping
    classifier = torch.nn.Linear(3, 1000)
    sampler = FeatureSampler(features, classifier)
    samples, logits = sampler.draw(20000, seed=3)
    flat = features.reshape(-1, 3)
    np.testing.assert_allclose(samples.mean(0).numpy(), flat.mean(0), atol=0.05)
    np.testing.assert_allclose(np.cov(samples.numpy().T), np.cov(flat.T), atol=0.1 * np.abs(np.cov(flat.T)).max())
    with torch.no_grad():
        assert torch.equal(logits, classifier(samples))
    assert torch.equal(sampler.draw(5, seed=3)[0], sampler.draw(5, seed=3)[0])
    # pooled ReLU features are never negative, nor are the samples
    assert float(FeatureSampler(features - 5.0, classifier).draw(1000, seed=0)[0].min()) == 0.0
    torch.set_num_threads(1)
    plain = build_topo_head_model(_config(tmp_path / "a"), tmp_path / "a" / "out", progress=False)
    sampled = build_topo_head_model(_config(tmp_path / "b", extra_training="feature_samples_per_step = 4"),
                                    tmp_path / "b" / "out", progress=False)
    again = build_topo_head_model(_config(tmp_path / "c", extra_training="feature_samples_per_step = 4"),
                                  tmp_path / "c" / "out", progress=False)
    assert (sampled / "weights.pt").read_bytes() == (again / "weights.pt").read_bytes()
    assert (sampled / "weights.pt").read_bytes() != (plain / "weights.pt").read_bytes()


def _imagenet_build(folder, **options):
    """A tiny build on MobileNetV2's ImageNet trunk (a random trunk gives the same features for every image)."""
    path = _config(folder, **options)
    path.write_text(path.read_text().replace('base_weights = "random"', 'base_weights = "imagenet"'))
    return build_topo_head_model(path, folder / "out", progress=False)


def test_principal_projection_keeps_the_leading_components_at_unit_mean_variance():
    from stimsim.training.trunk_features import principal_projection
    from stimsim.utilities.errors import ConfigError

    rng = np.random.default_rng(0)
    axes = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    features = (rng.normal(size=(2, 3000, 6)) * [5, 3, 2, 1, 0.5, 0.1]) @ axes.T + 2.0
    projection = principal_projection(features.astype(np.float32), 3).double().numpy()
    flat = features.reshape(-1, 6)
    # the projected features' covariance is diagonal, variances in the drawn ratio 25 : 9 : 4, mean 1
    np.testing.assert_allclose(np.cov((flat @ projection.T).T), np.diag([25, 9, 4]) / (38 / 3), atol=0.06)
    # the rows point along the three largest of the axes the data were drawn on (up to sign)
    cosines = np.abs(projection / np.linalg.norm(projection, axis=1, keepdims=True) @ axes[:, :3])
    np.testing.assert_allclose(cosines, np.eye(3), atol=0.05)
    with pytest.raises(ConfigError, match="rank 1 to 6"):
        principal_projection(features.astype(np.float32), 7)


@pytest.mark.parametrize("principal_rank", [8, 5])
def test_a_build_on_principal_components_keeps_them_fixed_and_trains_the_other_directions(
        tmp_path, base_network, principal_rank):
    """it_rank 8: all 8 directions fixed to the cached features' components, or 5 fixed and 3 trained."""
    from stimsim.data.manifest import cache_dir
    from stimsim.training.trunk_features import principal_projection

    base_network("mobilenet_v2")
    torch.set_num_threads(1)
    options = f'it_projection = "principal_components"\nit_principal_rank = {principal_rank}'
    weight = TopographicModel.load(_imagenet_build(tmp_path, extra_model=options)).network.it[0].weight.detach()
    # the projection of the build's cached trunk features (a random trunk's are not cached), unchanged by training
    cached = [np.load(path)["features"] for path in (cache_dir() / "trunk_features").glob("*.npz")]
    fixed = weight[:principal_rank]
    assert any(torch.equal(fixed, principal_projection(features, principal_rank).half().float()) for features in cached)
    if principal_rank == 8:
        return
    # the other rows left their initial values (the build's network at its seed, 0) and are no components
    torch.manual_seed(0)
    initial = TopoHeadNet("mobilenet_v2", it_units=64, it_rank=8, head_rank=8, n_domains=2).it[0].weight.detach()
    trained = weight[principal_rank:]
    # (6 Adam steps move a weight by up to about 6 × its warm-up learning rate; float16 rounds these by < 2e-5)
    assert float((trained - initial[principal_rank:]).abs().max()) > 1e-4
    assert not any(torch.allclose(trained, principal_projection(features, 8)[principal_rank:], atol=1e-2)
                   for features in cached)


def test_a_ridge_readout_build_is_deterministic_and_records_its_penalties(tmp_path, base_network):
    """On the ImageNet trunk (a random one gives the same IT activity for every image)."""
    from stimsim.training.ridge_readout import RELATIVE_PENALTIES

    base_network("mobilenet_v2")
    torch.set_num_threads(1)
    ridge = 'readout_fit = "ridge"\nreadout_samples = 16'

    first, again, distilled = (_imagenet_build(tmp_path / "a", readout=ridge), _imagenet_build(tmp_path / "b", readout=ridge),
                               _imagenet_build(tmp_path / "c"))
    assert (first / "weights.pt").read_bytes() == (again / "weights.pt").read_bytes()
    weights = {k: torch.load(path / "weights.pt", weights_only=True) for k, path in (("r", first), ("d", distilled))}
    # the same trained IT, other readouts
    assert torch.equal(weights["r"]["it.1.weight"], weights["d"]["it.1.weight"])
    assert not torch.equal(weights["r"]["head.1.weight"], weights["d"]["head.1.weight"])
    readouts = TopographicModel.load(first).metadata["readouts"]
    assert readouts["readout_fit"] == "ridge" and set(readouts) == {"readout_fit", "readout_views", "imagenet", "domain"}
    assert readouts["readout_views"] == "all"
    assert readouts["imagenet"]["relative_penalty"] in RELATIVE_PENALTIES
    assert len(readouts["domain"]["validation_agreement"]) == len(RELATIVE_PENALTIES)
    assert TopographicModel.load(distilled).metadata["readouts"] == {"readout_fit": "distill"}


def test_a_readout_fitted_on_the_clean_views_reproduces_a_teacher_that_noise_views_would_corrupt(tmp_path):
    """The teacher is a rank-4 linear function of IT's activity for the clean image (view 0), and view 1 is
    unrelated noise with the same teacher: fitted on the clean views the readout reproduces the teacher's class on
    nearly every image (a linear target of rank <= head_rank is fitted exactly but for the ridge penalty), fitted
    on every view it cannot (measured 0.99 and 0.74)."""
    from stimsim.training.ridge_readout import ridge_readouts

    torch.manual_seed(0)
    network = TopoHeadNet("mobilenet_v2", it_units=64, it_rank=8, head_rank=8, n_domains=2).eval()
    rng = np.random.default_rng(0)
    features = rng.random((2, 150, 1280)).astype(np.float32)
    with torch.no_grad():
        clean_activity = network.it(torch.from_numpy(features[0])).double()
    mapping = torch.from_numpy(rng.normal(size=(64, 4)) @ rng.normal(size=(4, 1000)))
    teacher = (clean_activity @ mapping).float().numpy()
    cached = {"features": features, "teacher": teacher}
    domains = np.arange(150) % 2
    classifier = torch.nn.Linear(1280, 1000)
    agreement = {}
    for views in ("clean", "all"):
        config, _, _ = load_head_config(_config(tmp_path / views, readout=f'readout_fit = "ridge"\nreadout_samples = 0\n'
                                                                            f'readout_views = "{views}"'))
        ridge_readouts(config, network, cached, domains, classifier, progress=False)
        with torch.no_grad():
            predicted = network.head(network.it(torch.from_numpy(features[0])))
        agreement[views] = float((predicted.argmax(1) == torch.from_numpy(teacher).argmax(1)).double().mean())
    assert agreement["clean"] >= 0.95
    assert agreement["all"] <= 0.85


def test_bad_build_file_names_the_key(tmp_path):
    from stimsim.utilities.errors import ConfigError

    path = _config(tmp_path)
    path.write_text(path.read_text().replace("it_rank = 8", "it_rank = 0"))
    with pytest.raises(ConfigError, match="it_rank"):
        load_head_config(path)
    path.write_text(path.read_text().replace("it_rank = 0", "it_rank = 8").replace(
        "cortex_mm_per_model_mm = 2.5", "cortex_mm_per_model_mm = 2.5\nface_cluster_cortex_mm = 4.0"))
    with pytest.raises(ConfigError, match="exactly one"):
        load_head_config(path)
    ridge_with_steps = _config(tmp_path / "r", extra_training='readout_fit = "ridge"')
    with pytest.raises(ConfigError, match="readout_steps"):
        load_head_config(ridge_with_steps)
    with pytest.raises(ConfigError, match="it_principal_rank needs it_projection"):
        load_head_config(_config(tmp_path / "p", extra_model="it_principal_rank = 4"))
    too_many = 'it_projection = "principal_components"\nit_principal_rank = 9'
    with pytest.raises(ConfigError, match=r"it_principal_rank must be at most it_rank \(8\), got 9"):
        load_head_config(_config(tmp_path / "q", extra_model=too_many))
    with pytest.raises(ConfigError, match=r"warmup_steps \(7\) must be at most steps \(6\)"):
        load_head_config(_config(tmp_path / "w", extra_training="warmup_steps = 7"))
    load_head_config(_config(tmp_path / "d"))  # the default warm-up (50 steps) is left to short trial runs


def test_densify_keeps_a_uniform_map_exactly():
    """A map whose units all share one tuning: every new unit has that tuning, and a readout that sums 4× more
    units at a quarter of the weight gives the same logits."""
    from stimsim.models.topo_head import densify

    torch.manual_seed(1)
    coarse = TopoHeadNet("mobilenet_v2", it_units=16, it_rank=4, head_rank=3, n_domains=2).eval()
    with torch.no_grad():
        coarse.it[1].weight.copy_(torch.randn(1, 4).expand(16, 4))
        coarse.it[1].bias.fill_(0.3)
        coarse.head[0].weight.copy_(torch.randn(3, 1).expand(3, 16))
        coarse.domain_head.weight.copy_(torch.randn(2, 1).expand(2, 16))
    dense = densify(coarse, 4, 8)
    assert dense.it[1].out_features == 64
    pooled = torch.randn(5, 1280)
    with torch.no_grad():
        assert torch.allclose(dense.head(dense.it(pooled)), coarse.head(coarse.it(pooled)), atol=1e-5)
        assert torch.allclose(dense.domain_head(dense.it(pooled)), coarse.domain_head(coarse.it(pooled)), atol=1e-5)


def test_densify_interpolates_a_linear_map_between_cell_centres():
    """Input weights that vary linearly with x on a 4 × 4 grid of a 4 mm sheet: a unit of the 8 × 8 grid at x mm
    (away from the border cells) gets the weight the linear map has at x."""
    from stimsim.models.topo_head import densify, grid_positions_mm

    coarse = TopoHeadNet("mobilenet_v2", it_units=16, it_rank=1, head_rank=1).eval()
    x_coarse = grid_positions_mm(4, 4.0)[:, 0]
    with torch.no_grad():
        coarse.it[1].weight.copy_(torch.tensor(2.0 * x_coarse - 1.0, dtype=torch.float32)[:, None])
    dense = densify(coarse, 4, 8)
    x_dense = grid_positions_mm(8, 4.0)[:, 0]
    inside = (x_dense > 0.5) & (x_dense < 3.5)
    assert np.allclose(dense.it[1].weight[:, 0].detach().numpy()[inside], 2.0 * x_dense[inside] - 1.0, atol=1e-5)


def test_grid_weights_are_resampled_once_for_inference_and_anew_after_any_change():
    """The dense weights of a trained-grid IT are the bilinear resampling of its coarse grid: kept between calls
    that send no gradient to the parameters (inference, input-only gradients), resampled after an in-place change
    or a replaced parameter, and resampled at every call, with gradients, while the parameters train."""
    from stimsim.models import topo_head
    from stimsim.models.topo_head import GridInterpolatedLinear

    torch.manual_seed(0)
    layer = GridInterpolatedLinear(in_features=3, grid_side=4, dense_side=8)
    x = torch.randn(5, 3)
    calls = []
    resample = topo_head._resample

    def counting(*args):
        calls.append(args[1:])
        return resample(*args)

    topo_head._resample = counting
    try:
        def expected():
            weight = torch.nn.functional.interpolate(layer.weight.detach().T.reshape(1, 3, 4, 4), size=(8, 8),
                                                     mode="bilinear", align_corners=False).reshape(3, 64).T
            bias = torch.nn.functional.interpolate(layer.bias.detach().reshape(1, 1, 4, 4), size=(8, 8),
                                                   mode="bilinear", align_corners=False).reshape(64)
            return x @ weight.T + bias

        with torch.no_grad():
            first, second = layer(x), layer(x)
        assert torch.allclose(first, expected(), atol=1e-6) and torch.equal(first, second)
        assert len(calls) == 2                       # weight and bias, once
        layer.requires_grad_(False)
        x_grad = x.clone().requires_grad_(True)
        layer(x_grad).sum().backward()               # an input-only gradient reuses the kept weights
        assert len(calls) == 2 and x_grad.grad is not None
        layer.requires_grad_(True)
        with torch.no_grad():
            layer.weight.add_(1.0)                   # an in-place change (an optimiser step, load_state_dict)
            assert torch.allclose(layer(x), expected(), atol=1e-5)
        assert len(calls) == 4
        layer.bias = torch.nn.Parameter(torch.zeros(16))  # a replaced parameter
        with torch.no_grad():
            assert torch.allclose(layer(x), expected(), atol=1e-5)
        assert len(calls) == 6
        layer(x).sum().backward()                    # training: fresh weights, gradients reach the grid
        layer(x).sum().backward()
        assert len(calls) == 10
        assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0
        with torch.no_grad():
            kept = layer(x)
        copied = pickle.loads(pickle.dumps(layer))   # as a model sent to a worker: the kept weights stay behind
        assert layer._dense is not None and copied._dense is None
        with torch.no_grad():
            assert torch.equal(copied(x), kept)
    finally:
        topo_head._resample = resample


def test_the_build_file_in_experiments_parses():
    from pathlib import Path

    config, _, _ = load_head_config(Path(__file__).resolve().parents[1] / "experiments" / "build_stimsim_mnv2_s0.toml")
    assert config.model.base_network == "mobilenet_v2" and config.model.grid_side == 224
    assert config.cortex_scale.face_cluster_cortex_mm == 4.0


def test_models_on_the_same_trunk_share_its_output_and_get_exactly_their_own(one_torch_thread):
    """Inside shared_trunk_outputs, stimsim-mnv2-s1 reuses the trunk output stimsim-mnv2-s0 computed for the same
    images (the trunk runs once) and gets bit for bit what it computes alone; a trunk whose weights differ, or
    another input, is computed anew; outside the block nothing is kept."""
    from stimsim.models.registry import load_model
    from stimsim.models.shared_trunk import shared_trunk_outputs

    first, second, changed = (load_model(name) for name in ("stimsim-mnv2-s0", "stimsim-mnv2-s1", "stimsim-mnv2-s1"))
    with torch.no_grad():
        next(changed.stages[0][1].parameters()).mul_(1.01)  # one trunk weight changed
    passes = []  # the model of every pass through the trunk's first stage
    for model in (first, second, changed):
        model.stages[0][1].register_forward_hook(lambda *args, model=model: passes.append(model))
    images = np.random.default_rng(0).uniform(0, 1, (2, 224, 224, 3)).astype(np.float32)
    alone = {name: model.activations(images, "IT") for name, model in (("second", second), ("changed", changed))}
    assert len(passes) == 2
    passes.clear()
    with shared_trunk_outputs() as kept:
        first.activations(images, "IT")
        shared = second.activations(images, "IT")
        own = changed.activations(images, "IT")
        other = second.activations(images[::-1].copy(), "IT")
    assert passes == [first, changed, second] and kept.hits == 1
    assert torch.equal(shared, alone["second"]) and torch.equal(own, alone["changed"])
    assert not torch.equal(own, shared) and torch.equal(other, alone["second"].flip(0))
    passes.clear()
    second.activations(images, "IT")
    assert passes == [second]


_TUNING = """
[trunk_tuning]
first_module = "14"
epochs = 4
views = 3
batch_size = 6
learning_rate = 1e-3
"""


def test_splitting_a_trunk_keeps_its_modules_and_their_order():
    from torch import nn

    from stimsim.training.trunk_tuning import split_trunk
    from stimsim.utilities.errors import ConfigError

    torch.manual_seed(0)
    trunk = TopoHeadNet(it_units=16, it_rank=4, head_rank=4).trunk.eval()
    frozen, tuned = split_trunk(trunk, "14")
    assert len(frozen) == 14 and len(tuned) == 5 and tuned[0] is trunk[14]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(tuned(frozen(x)), trunk(x))
    # a dotted path goes into nested containers (as EfficientNet's block stages are)
    nested = nn.Sequential(nn.Identity(), nn.Sequential(nn.ReLU(), nn.Tanh(), nn.Sigmoid()), nn.ELU())
    frozen, tuned = split_trunk(nested, "1.1")
    assert [type(m).__name__ for m in frozen.modules()][1:] == ["Identity", "Sequential", "ReLU"]
    assert [type(m).__name__ for m in tuned.modules()][1:] == ["Sequential", "Tanh", "Sigmoid", "ELU"]
    with pytest.raises(ConfigError, match="'19' is not a module.*0, 1, 2"):
        split_trunk(trunk, "19")


def test_trunk_tuning_pulls_noisy_features_to_the_clean_ones_and_only_tunes_its_modules(tmp_path):
    from stimsim.models.base_networks import load_base_network

    torch.set_num_threads(1)
    built = build_topo_head_model(_config(tmp_path, extra_tables=_TUNING), tmp_path / "out", progress=False)
    model = TopographicModel.load(built)
    losses = model.metadata["trunk_tuning"]["loss_by_epoch"]
    assert model.metadata["trunk_tuning"]["first_module"] == "14" and len(losses) == 4
    assert losses[-1] < 0.8 * losses[0]
    torch.manual_seed(0)  # the build's random base network comes from its training seed
    base = load_base_network("mobilenet_v2", pretrained=False).features
    stored = torch.load(built / "weights.pt", weights_only=True)
    # the modules before features.14 keep their weights, the later ones are tuned; BatchNorm keeps its statistics
    for name, value in base.named_parameters():
        same = torch.equal(stored[f"trunk.{name}"].float(), value.detach().half().float())
        assert same == (int(name.split(".")[0]) < 14), name
    for name, value in base.named_buffers():
        assert torch.equal(stored[f"trunk.{name}"].float(), value.half().float()), name


def test_trunk_tuning_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path):
    import copy

    from stimsim.data.stimuli import from_folder
    from stimsim.models.base_networks import base_network_spec
    from stimsim.models.preprocessing import Preprocessing
    from stimsim.training.trunk_tuning import TrunkTuningTable, tune_trunk

    torch.set_num_threads(1)
    _write_images(tmp_path / "images")
    stimuli = from_folder(tmp_path / "images")
    tuning = TrunkTuningTable(first_module="16", epochs=3, views=2, batch_size=4)
    preprocessing = Preprocessing.from_dict({**base_network_spec("mobilenet_v2").preprocessing.to_dict(), "size_px": 32})
    torch.manual_seed(0)
    base = TopoHeadNet(it_units=16, it_rank=4, head_rank=4).trunk.eval()
    runs = {}
    for name, stops in (("whole", [None]), ("resumed", [1, None])):
        trunk = copy.deepcopy(base)
        (tmp_path / name).mkdir()
        for stop in stops:
            history = tune_trunk(tuning, 0, (0.6, 1.0), stimuli, trunk, base, preprocessing, tmp_path / name,
                                 progress=False, stop_after_epoch=stop)
        runs[name] = (trunk.state_dict(), history)
    assert runs["whole"][1] == runs["resumed"][1] and len(runs["whole"][1]) == 3
    for key, value in runs["whole"][0].items():
        assert torch.equal(value, runs["resumed"][0][key]), key


def test_a_holdout_that_leaves_a_class_no_training_image_is_refused_naming_the_set(tmp_path):
    from stimsim.training.head_training import load_sets
    from stimsim.utilities.errors import ConfigError

    path = _config(tmp_path)
    path.write_text(path.read_text().replace("holdout_fraction = 0.25", "holdout_fraction = 0.95"))
    config, _, folder = load_head_config(path)
    with pytest.raises(ConfigError, match=r"build.toml \[data\] sets\[0\] \(\w+\): holdout_fraction = 0.95 holds out "
                                          r"all 6 image\(s\) of class '(adult|car)', leaving none to train on"):
        load_sets(config, folder, str(path))


@pytest.mark.parametrize("changes, message", [
    ({'object = ["car"]': 'object = ["car", "adult"]'},
     r"\[data\]: 'domains' gives category 'adult' to more than one domain \(\['face', 'object'\]\)"),
    ({'object = ["car"]': 'object = ["cars"]'},
     r"\[data.domains\] object: no image of the sets has category \['cars'\]; a domain gathers values the images "
     r"have: \['adult', 'car'\]"),
    ({"cortex_mm_per_model_mm = 2.5": "face_cluster_cortex_mm = 4.0", 'face = ["adult"]': 'faces = ["adult"]'},
     r"\[cortex_scale\] face_cluster_cortex_mm measures the clusters of \[data\] positive_domain 'face' .* "
     r"domains: \['faces', 'object'\]"),
    ({"neighborhoods_per_step = 2": "neighborhoods_per_step = 9"},
     r"\[training\] neighborhoods_per_step \(9\) must be at most \[model\] n_neighborhoods \(8\)"),
    ({"neighborhood_width_mm = 2.0": "neighborhood_width_mm = 4.5"},
     r"\[model\]: neighborhood_width_mm \(4.5\) must be at most sheet_size_mm \(4\)"),
    ({"neighborhood_width_mm = 2.0": "neighborhood_width_mm = 0.01"},  # the 8 x 8 grid's pitch is 0.5 mm
     r"\[model\] neighborhood_width_mm: sheet 'it': neighbourhoods 0.01 mm wide hold fewer than 2 units"),
    ({"[cortex_scale]": '[trunk_tuning]\nfirst_module = "19"\n[cortex_scale]'},  # MobileNetV2's trunk: 0-18
     r"\[trunk_tuning\] first_module '19': '19' is not a module"),
])
def test_a_build_file_that_cannot_build_is_refused_in_one_line_before_any_work(tmp_path, capsys, changes, message):
    """A category in two domains, one no image has, a face-cluster scale without its domain, more neighbourhoods per
    step than prepared, neighbourhoods wider than the sheet or narrower than two units, a trunk module that is not
    there: one line naming the file and the key, before any work (they were taken silently, or failed with a
    traceback, some after training)."""
    from stimsim.cli import main

    path = _config(tmp_path)
    text = path.read_text()
    for old, new in changes.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text)
    assert main(["train", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert re.match(rf"stimsim: error: {re.escape(str(path))}:? {message}", err), err
    assert not (tmp_path / "run").exists()


def test_a_build_refuses_a_device_it_does_not_run_on(tmp_path, capsys, monkeypatch):
    """A topo_head build trains on the CPU: --device cuda is an error, not a build on the CPU unsaid."""
    import stimsim.cli as cli

    monkeypatch.setattr(cli, "resolve_device", lambda device: torch.device("cuda"))  # as on a machine with a GPU
    path = _config(tmp_path)
    assert cli.main(["train", str(path), "--out", str(tmp_path / "run"), "--no-progress", "--device", "cuda"]) == 2
    assert capsys.readouterr().err == (f"stimsim: error: {path}: a topo_head build runs on the CPU; --device cuda is "
                                       "for networks trained from scratch (leave --device out)\n")
    assert not (tmp_path / "run").exists()


def test_build_sets_that_share_images_are_refused_naming_both_sets(tmp_path):
    from stimsim.training.head_training import load_sets
    from stimsim.utilities.errors import ConfigError

    path = _config(tmp_path)  # the same folder twice: one set would train on images the other holds out
    one = '{ source = "folder", path = "images", holdout_fraction = 0.25 }'
    path.write_text(path.read_text().replace(one, f"{one}, {one.replace('0.25', '0.5')}"))
    config, _, folder = load_head_config(path)
    with pytest.raises(ConfigError, match=r"build.toml \[data\] sets\[0\] and sets\[1\] share 12 image\(s\)"):
        load_sets(config, folder, str(path))

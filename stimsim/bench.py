"""Benchmark of the simulation engine against the plain approach (one full forward pass per condition).

Two workloads of a site sweep (Mehrer et al. 2025, arXiv 2510.03684, rehearse every candidate site on
every image; Moeller et al. 2017, Nat Neurosci 20:743, 300 µA):

- ``it``: stimulation at IT (``layer4.1`` of a TDANN-sized ResNet-18, 512×7×7 = 25,088 units at 224 px,
  on a 70 mm sheet as in Margalit et al. 2024), decoder on the same layer: 256 sites × 200 images.
- ``pre_it``: stimulation at ``layer4.0``, decoder on ``layer4.1``: 64 sites × 100 images.

Speedup = (site·image pairs per second, engine) / (same, plain). The plain approach is linear in the
number of sites, so it is timed on the first ``n_plain_sites`` sites only, and both outputs are compared
there. The images are the 100 face and 100 non-face crops of Labeled Faces in the Wild bundled with
scikit-image; the ResNet-18 has random weights (timing does not depend on them).
"""
from __future__ import annotations

import os
import resource
import sys
import time

import numpy as np
import torch

from stimsim.behavior import LogisticDecoder
from stimsim.engine import DEFAULT_MAX_CHUNK_BYTES, simulate, simulate_plain
from stimsim.errors import ConfigError
from stimsim.models.architectures import build_network
from stimsim.models.positions import retinotopic_positions
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.progress import report_phase
from stimsim.sheet import CorticalSheet
from stimsim.stimulation import Condition, ElectricalStimulation

#: Workload sizes: image size of the ResNet-18 (px), (sites, images) per workload, plain sites.
FULL_SIZES = {"size_px": 224, "it": (256, 200), "pre_it": (64, 100), "n_plain_sites": 8}
QUICK_SIZES = {"size_px": 32, "it": (4, 4), "pre_it": (3, 4), "n_plain_sites": 2}

#: Targets of the engine on the ResNet-18 workloads.
TARGET_SPEEDUP_IT = 50.0
TARGET_SPEEDUP_PRE_IT = 3.0

#: Side of the TDANN layer4 (VTC, "IT") sheet, mm (Margalit et al. 2024).
RESNET_IT_SHEET_MM = 70.0

#: Stimulation of every site: Moeller et al. 2017 current and frequency.
STIM_CURRENT_UA = 300.0
STIM_FREQUENCY_HZ = 150.0
#: 300 µA exceeds Shannon's limit on a Utah tip; the benchmark times computation and proposes no protocol.
SAFETY_OVERRIDE = "speed benchmark of the simulation engine; no stimulation protocol is proposed"

#: Regularisation of the decoder (Brain-Score's behavioural decoders, Schrimpf et al. 2024).
DECODER_C = 1e-3


def time_load_and_activations(model_name: str, n_images: int = 100) -> dict:
    """Seconds to load a (shipped) model from disk, checksums included, and to compute its IT
    activations for ``n_images`` images (target for the shipped models: under 5 s on 2 cores)."""
    from stimsim.models.registry import load_model

    images, _ = _face_images(n_images)
    start = time.perf_counter()
    model = load_model(model_name)
    loaded = time.perf_counter()
    it_layer, _ = _it_layers(model)
    model.activations(images, it_layer)
    done = time.perf_counter()
    return {"model": model_name, "n_images": n_images, "load_s": loaded - start, "activations_s": done - loaded,
            "total_s": done - start}


def run_benchmark(quick: bool = False, default_model: TopographicModel | None = None,
                  max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES, seed: int = 0, progress: bool = False) -> dict:
    """Time engine and plain simulation on a ResNet-18 (and on ``default_model`` when given).

    ``quick`` shrinks every size (32 px ResNet, a few sites and images) for a smoke test. Returns a JSON-ready
    dict: ``speedup_it``, ``speedup_pre_it``, ``max_abs_diff_it``, ``max_abs_diff_pre_it``, engine and plain
    pairs per second, seconds, sizes, ``peak_rss_MB`` (peak resident memory of the process) and, with a
    default model, the same measurements under ``"default_model"``.
    """
    sizes = QUICK_SIZES if quick else FULL_SIZES
    resnet = _resnet_model(sizes["size_px"], seed)
    report = {"quick": bool(quick), "max_chunk_bytes": int(max_chunk_bytes), "torch_threads": torch.get_num_threads(),
              "cpu_count": os.cpu_count(), "stim_current_uA": STIM_CURRENT_UA, "stim_frequency_Hz": STIM_FREQUENCY_HZ,
              "target_speedup_it": TARGET_SPEEDUP_IT, "target_speedup_pre_it": TARGET_SPEEDUP_PRE_IT}
    report.update(_benchmark_model(resnet, "layer4.1", "layer4.0", sizes, max_chunk_bytes, seed, progress))
    report["meets_targets"] = bool(report["speedup_it"] >= TARGET_SPEEDUP_IT
                                   and report["speedup_pre_it"] >= TARGET_SPEEDUP_PRE_IT)
    if default_model is not None:
        it_layer, pre_it_layer = _it_layers(default_model)
        report["default_model"] = _benchmark_model(default_model, it_layer, pre_it_layer, sizes, max_chunk_bytes,
                                                   seed, progress)
    report["peak_rss_MB"] = _peak_rss_MB()
    return report


def _benchmark_model(model: TopographicModel, it_layer: str, pre_it_layer: str, sizes: dict, max_chunk_bytes: int,
                     seed: int, progress: bool) -> dict:
    """Both workloads on one model; the decoder reads ``it_layer`` in both."""
    n_images = max(sizes["it"][1], sizes["pre_it"][1])
    images, labels = _face_images(n_images)
    decoder = LogisticDecoder.fit(model.activations(images, it_layer), labels, layer=it_layer, C=DECODER_C)
    result = {"model": model.name, "image_size_px": model.preprocessing.size_px, "it_layer": it_layer,
              "pre_it_layer": pre_it_layer, "decoder_layer": it_layer, "n_plain_sites": sizes["n_plain_sites"]}
    for key, layer in (("it", it_layer), ("pre_it", pre_it_layer)):
        n_sites, n_workload_images = sizes[key]
        timing = _measure(model, images[:n_workload_images], layer, decoder, n_sites, sizes["n_plain_sites"], max_chunk_bytes,
                          seed, progress)
        result.update({f"{name}_{key}": value for name, value in timing.items()})
    return result


def _measure(model, images, layer, decoder, n_sites, n_plain_sites, max_chunk_bytes, seed, progress) -> dict:
    """Engine on every site and plain on the first ``n_plain_sites``; rates, speedup and largest difference."""
    report_phase(f"bench: {model.name}, {n_sites} sites × {len(images)} images at {layer} (engine, then plain "
                 f"on {n_plain_sites} sites)", progress)
    conditions = _site_conditions(model.sheet(layer), layer, n_sites, seed)
    model.run_stages(model.preprocess(images[:2]))  # first calls pay one-off allocations; keep them out of timing
    start = time.perf_counter()
    engine = simulate(model, images, conditions, decoder, max_chunk_bytes=max_chunk_bytes, progress=progress,
                      safety_override=SAFETY_OVERRIDE)
    engine_s = time.perf_counter() - start
    start = time.perf_counter()
    plain = simulate_plain(model, images, conditions[:n_plain_sites], decoder, progress=progress,
                           safety_override=SAFETY_OVERRIDE)
    plain_s = time.perf_counter() - start
    engine_rate = n_sites * len(images) / engine_s
    plain_rate = n_plain_sites * len(images) / plain_s
    return {
        "speedup": engine_rate / plain_rate,
        "max_abs_diff": float(np.abs(engine.values[:n_plain_sites] - plain.values).max()),
        "engine_pairs_per_s": engine_rate,
        "plain_pairs_per_s": plain_rate,
        "engine_s": engine_s,
        "plain_s": plain_s,
        "n_sites": n_sites,
        "n_images": len(images),
        "layer": layer,
    }


def _site_conditions(sheet: CorticalSheet, layer: str, n_sites: int, seed: int) -> list[Condition]:
    """One single-electrode stimulation condition per site, sites uniform over the sheet's extent."""
    x0, x1, y0, y1 = sheet.extent_mm
    sites = np.random.default_rng(seed).uniform((x0, y0), (x1, y1), size=(n_sites, 2))
    return [Condition(f"site_{i:03d}", (ElectricalStimulation(((float(x), float(y)),), current_uA=STIM_CURRENT_UA,
                                                              frequency_Hz=STIM_FREQUENCY_HZ, layer=layer),))
            for i, (x, y) in enumerate(sites)]


def _resnet_model(size_px: int, seed: int) -> TopographicModel:
    """TDANN-sized ResNet-18 (random weights) with retinotopic 70 mm sheets on layer4.0 and layer4.1."""
    torch.manual_seed(seed)
    network = build_network("tdann_resnet18")
    preprocessing = Preprocessing(size_px=size_px, channels=3)
    architecture = {"family": "tdann_resnet18", "kwargs": {}}
    bare = TopographicModel(network, {}, preprocessing, architecture)
    dims = bare.stage_output_dims(torch.zeros(1, 3, size_px, size_px))
    sheets = {layer: CorticalSheet(layer, dims[layer], retinotopic_positions(dims[layer], RESNET_IT_SHEET_MM,
                                                                             seed=seed + i))
              for i, layer in enumerate(("layer4.0", "layer4.1"))}
    return TopographicModel(network, sheets, preprocessing, architecture, readout_layer="layer4.1",
                            areas={"layer4.1": "IT"}, name="tdann_resnet18 (random weights)")


def _it_layers(model: TopographicModel) -> tuple[str, str]:
    """(IT layer, the topographic layer before it): IT is the layer labelled "IT", else the readout layer."""
    try:
        it_layer = model.resolve_layer("IT")
    except ConfigError:
        it_layer = model.readout_layer
    model.sheet(it_layer)
    earlier = [layer for layer in model.layers if model.stage_names.index(layer) < model.stage_names.index(it_layer)]
    if not earlier:
        raise ConfigError(f"model {model.name!r} has no topographic layer before its IT layer {it_layer!r}; "
                          f"the pre-IT workload needs one (topographic layers: {model.layers})")
    return it_layer, earlier[-1]


def _face_images(n_images: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n_images of LFW's 100 faces and 100 non-faces, interleaved so that any first n ≥ 2 of them
    hold both classes (25×25 grayscale in [0, 1]), and their labels."""
    from skimage.data import lfw_subset

    crops = lfw_subset()
    if not 2 <= n_images <= len(crops):
        raise ConfigError(f"the benchmark uses 2 to {len(crops)} images, got {n_images}")
    order = np.stack([np.arange(100), np.arange(100, 200)], axis=1).reshape(-1)[:n_images]
    labels = np.where(order < 100, "face", "nonface")
    return crops[order].astype(np.float32), labels


def _peak_rss_MB() -> float:
    """Peak resident memory of this process, MB (ru_maxrss is in kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


#: Analysis workload (sites, trials per site) and its target, s on 2 CPU cores.
ANALYSIS_SIZES = {"full": (100, 1000), "quick": (10, 100)}
TARGET_ANALYSIS_S = 30.0


def time_analysis(quick: bool = False, seed: int = 0) -> dict:
    """Seconds of ``stimsim analyze`` without its report on a planted session (100 sites × 1,000 trials,
    stimulated and sham 50/50; quick: 10 × 100): reading and validating the CSV, then every statistic
    with 1,000 bootstrap resamples and 1,000 label permutations per site. Target: under 30 s on 2 cores."""
    import tempfile

    from stimsim.analysis import analyze, load_sessions
    from stimsim.analysis.synthetic import planted_session

    n_sites, trials_per_site = ANALYSIS_SIZES["quick" if quick else "full"]
    effects = np.random.default_rng(seed).normal(0.0, 1.0, n_sites)
    with tempfile.TemporaryDirectory() as directory:
        path = f"{directory}/session.csv"
        planted_session(effects, trials_per_site, seed=seed).to_csv(path, index=False)
        start = time.perf_counter()
        sessions = load_sessions(path)
        loaded = time.perf_counter()
        analyze(sessions, n_boot=1000, n_perm=1000, seed=seed)
        done = time.perf_counter()
    return {"n_sites": n_sites, "trials_per_site": trials_per_site, "load_s": loaded - start,
            "statistics_s": done - loaded, "total_s": done - start, "target_s": TARGET_ANALYSIS_S,
            "total_over_target": (done - start) / TARGET_ANALYSIS_S}

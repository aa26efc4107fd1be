"""Benchmark of the simulation engine: against the exact lower bound, a cached baseline, the plain approach.

Workloads of a site sweep (Mehrer et al. 2025, arXiv 2510.03684, rehearse every candidate site on
every image; Moeller et al. 2017, Nat Neurosci 20:743, 300 µA):

- ``it``: stimulation at IT (``layer4.1`` of a TDANN-sized ResNet-18, 512×7×7 = 25,088 units at 224 px,
  on a 70 mm sheet as in Margalit et al. 2024), decoder on the same layer: 256 sites × 200 images.
- ``pre_it``: stimulation at ``layer4.0``, decoder on ``layer4.1``: 64 sites × 100 images.
- ``small``: the small shipped model (stimsim-topo-s0, IT = 4,096 units), 1,024 IT sites × 800 images.
- ``dask``: a sweep of the small model at V4 (decoder on IT; every (site, image) pair runs V4 → IT),
  512 sites × 100 images, on 1 and on 2 Dask worker processes of one thread each.

What each number means (all measured in the same run; timed sections are interleaved and repeated,
and the minimum of ``repeats`` ≥ 3 is kept):

``engine_over_bound_it`` / ``_small``
    engine time ÷ the exact lower bound of the job: the forward pass from the images to the perturbed
    layer plus the single float32 matrix product (conditions × (choices − 1), units) @ (units, images)
    that the linear readout needs. 1.0 would be perfect.
``engine_vs_cached_baseline`` / ``_small``
    time of :func:`cached_baseline` ÷ engine time. The baseline is what a competent user writes without
    stimsim's engine: activations cached once, each condition's effect, perturbed activity of a chunk
    of conditions for all images, the decoder on it. Both include the forward pass. On ``small`` the
    baseline (about 35× slower) runs on the first 128 sites and the ratio is of pairs per second.
``speedup_it`` / ``speedup_pre_it``
    site·image pairs per second of the engine ÷ those of the *plain* approach (a full forward pass per
    condition with a hook). The plain approach repeats the forward pass for every site, so this ratio
    grows with the number of sites by construction (about half the number of sites at IT); it says
    that caching activations pays, not that the engine is fast. The plain approach is timed on the first
    ``n_plain_sites`` sites (its cost is linear in sites) and the outputs are compared there.
``dask_2workers_vs_1``
    wall time of the Dask sweep on 1 worker process ÷ on 2 (clusters started and warmed beforehand; the
    same (condition, image) pairs both ways). Perfectly parallel work gives 2.0; ``dask_ideal_2workers_vs_1`` is that
    bound less this process's own share (``dask_serial_s``, the forward passes it makes before sending
    the work), from the 1-worker time of the same run. ``dask_2workers_vs_1_cpu`` = CPU seconds of the
    1-worker sweep ÷ those of the busier of the 2 workers (``dask_1worker_cpu_s``,
    ``dask_2workers_busier_cpu_s``): how evenly and cheaply the work splits, which other load on a shared
    machine does not change; the wall-time ratio reaches it only when each worker has a free core.
``max_abs_diff_*``
    largest difference of choice probabilities between the engine and the approach compared.
``smoothing_vs_loop`` (section ``maps``)
    a Gaussian-smoothed selectivity map (:func:`~stimsim.cortex.topography.smoothed_values_at`, σ 0.5 mm, on
    the 0.1 mm grid of a face-patch search) on the IT sheet of stimsim-mnv2-s0 (50,176 units): points per second
    against the simplest exact alternative, a loop over the points that weights the units within 3σ of each
    (:func:`looped_smoothing`, timed on the first ``maps_loop_points`` points; its cost is linear in points).
``cache_reuse_vs_forward`` / ``cache_store_over_forward`` (section ``cache``)
    IT activity of stimsim-mnv2-s0 for 100 images at 224 px: the forward pass (``model.activations``) ÷ reading
    it back from the activation cache (checksum and the recomputed sample rows included), and the first,
    storing call ÷ the forward pass alone (what keeping an entry costs a run).
``plan_phases`` (section ``plan``)
    the 2AFC plan's work per working electrode on an ImageNet-based model at 224 px (stimsim-mnv2-s0, at
    the settings of ``experiments/plan_imagenet.toml``): seconds per site of the sequence design (gradient
    steps through the whole network), of the frozen decoders and of the rehearsal (no stimulation and the
    fitted plus bootstrap poses' stimulation, on the engine's exact path), and what they add up to for the
    default ImageNet plan (``plan_default_sites`` electrodes: the design once, decoders and rehearsal in each
    of two candidates and in the subject). The phases' own work, measured on a few sites; no ratio.

The images are the 100 face and 100 non-face crops of Labeled Faces in the Wild bundled with
scikit-image (800 for ``small``: each crop, mirrored left-right, up-down and both); the ResNet-18 has
random weights (timing does not depend on them).

``jobs`` (section ``jobs``, run only when named)
    wall time, CPU time and peak memory of the README's jobs as a user runs them, each in a child process
    on an empty activation cache (:mod:`stimsim.engine.jobs_bench`); absolute figures against the targets
    of the jobs, no ratio.

Sections are listed in :data:`SECTIONS`; :func:`register_section` adds one (a function of the
:class:`BenchContext` returning a dict of report entries). The report records the software versions, the
processor, the checkout's commit and the load average at the start, beside what was measured.

Over 500 lines: every workload of the benchmark and the exact bound and baselines it is measured against sit
in one file, so that one run's ratios come from one place.
"""
from __future__ import annotations

import itertools
import os
import platform
import resource
import tempfile
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from stimsim.behavior import LogisticDecoder
from stimsim.cortex.positions import retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.cortex.topography import sheet_grid, smoothed_values_at
from stimsim.engine import DEFAULT_MAX_CHUNK_BYTES, chunk_count, serial_work, simulate, simulate_plain
from stimsim.engine.devices import resolve_device
from stimsim.engine.jobs_bench import check_jobs, max_rss_MB
from stimsim.models.architectures import build_network
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.stimulation import Condition, ElectricalStimulation
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.io import software_versions
from stimsim.utilities.progress import report_phase

#: Smoothing of the ``maps`` section: the defaults of :func:`~stimsim.cortex.topography.smoothed_map`, with which a
#: face-patch search finds its peak: σ and grid step, mm.
MAPS_SIGMA_MM = 0.5
MAPS_GRID_STEP_MM = 0.1

#: Workload sizes: image size of the ResNet-18 (px), (sites, images) per workload, plain sites, timing repeats.
FULL_SIZES = {"size_px": 224, "it": (256, 200), "pre_it": (64, 100), "n_plain_sites": 4, "small": (1024, 800),
              "small_baseline_sites": 128, "dask": (512, 100), "repeats": 3, "plan_sites": 4, "plan_iterations": 20,
              "maps_loop_points": 2000, "cache_images": 100}
QUICK_SIZES = {"size_px": 32, "it": (4, 4), "pre_it": (3, 4), "n_plain_sites": 2, "small": (8, 8),
               "small_baseline_sites": 4, "dask": None, "repeats": 1, "plan_sites": 1, "plan_iterations": 1,
               "maps_loop_points": 50, "cache_images": 8}

#: The ImageNet-based model of the ``plan`` section, and the working electrodes of the default ImageNet plan
#: (75 of its virtual subject's 100: 5 dead, the others below the split-half reliability limit).
PLAN_MODEL = "stimsim-mnv2-s0"
PLAN_DEFAULT_SITES = 75
#: Bootstrap poses of the plan (``[registration] n_boot``): each site is rehearsed at 1 + this many points.
PLAN_N_BOOT = 5
#: The plan's stimulation (Mehrer et al. 2025: 50 µA, 200 Hz).
PLAN_CURRENT_UA, PLAN_FREQUENCY_HZ = 50.0, 200.0

#: Targets of the engine.
TARGET_SPEEDUP_IT = 50.0
TARGET_SPEEDUP_PRE_IT = 3.0
TARGET_ENGINE_OVER_BOUND_IT = 1.2
TARGET_ENGINE_OVER_BOUND_SMALL = 2.0
TARGET_ENGINE_VS_CACHED_BASELINE = 1.25
TARGET_DASK_2WORKERS_VS_1 = 1.6
#: Loading the small model and its IT activations, s on 2 CPU cores.
TARGET_LOAD_AND_ACTIVATIONS_S = 5.0
#: Analysis workload (sites, trials per site) and its target, s on 2 CPU cores.
ANALYSIS_SIZES = {"full": (100, 1000), "quick": (10, 100)}
TARGET_ANALYSIS_S = 30.0
#: Largest difference of choice probabilities allowed between the engine and what it is compared with.
TARGET_MAX_ABS_DIFF = 1e-6

#: Side of the TDANN layer4 (VTC, "IT") sheet, mm (Margalit et al. 2024).
RESNET_IT_SHEET_MM = 70.0

#: Stimulation of every site: Moeller et al. 2017 current and frequency.
STIM_CURRENT_UA = 300.0
STIM_FREQUENCY_HZ = 150.0
#: 300 µA exceeds Shannon's limit on a Utah tip; the benchmark times computation and proposes no protocol.
SAFETY_OVERRIDE = "speed benchmark of the simulation engine; no stimulation protocol is proposed"

#: Regularisation of the decoder (Brain-Score's behavioural decoders, Schrimpf et al. 2024).
DECODER_C = 1e-3

#: Memory of one chunk of perturbed activity in the cached baseline, bytes.
BASELINE_CHUNK_BYTES = 256 << 20


@dataclass
class BenchContext:
    """What every section gets: sizes, device, seed, the engine's chunk budget, the default model (or None)."""

    sizes: dict
    device: torch.device
    seed: int
    max_chunk_bytes: int
    progress: bool
    default_model: TopographicModel | None
    default_model_source: str | None = None
    #: Jobs of the ``jobs`` section to run (None: all) and the callback given each job's figures as they come.
    job_names: list[str] | None = None
    jobs_out: str | None = None
    on_job: Callable[[dict], None] | None = None
    #: The sections named in the call (a named section that cannot measure says why).
    named: tuple[str, ...] = ()
    _resnet: TopographicModel | None = None
    _imagenet_model: TopographicModel | None = None

    @property
    def resnet(self) -> TopographicModel:
        """The TDANN-sized ResNet-18 of the ``it`` and ``pre_it`` workloads (built once)."""
        if self._resnet is None:
            self._resnet = _resnet_model(self.sizes["size_px"], self.seed).to(self.device)
        return self._resnet

    @property
    def imagenet_model(self) -> TopographicModel:
        """:data:`PLAN_MODEL` with its IT sheet in cortex mm, of the ``plan``, ``maps`` and ``cache`` sections
        (loaded once)."""
        if self._imagenet_model is None:
            from stimsim.models.registry import load_model

            self._imagenet_model, _ = load_model(PLAN_MODEL, device=self.device).in_cortex_mm("IT")
        return self._imagenet_model


#: The benchmark's sections, run in this order: (name, function of the context → report entries).
SECTIONS: list[tuple[str, Callable[[BenchContext], dict]]] = []
#: Sections run only when named (their work takes far longer than the others').
ON_REQUEST_SECTIONS: set[str] = set()


def register_section(name: str, on_request: bool = False):
    """Decorator adding a section to :data:`SECTIONS` (its entries are merged into the report); an
    ``on_request`` section runs only when ``sections`` names it."""
    def add(function):
        SECTIONS.append((name, function))
        if on_request:
            ON_REQUEST_SECTIONS.add(name)
        return function

    return add


def run_benchmark(quick: bool = False, default_model: TopographicModel | None = None,
                  max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES, seed: int = 0, progress: bool = False,
                  device="cpu", sections=None, default_model_source: str | None = None, job_names=None,
                  jobs_out=None, on_partial: Callable[[dict], None] | None = None) -> dict:
    """Run the benchmark sections (all but the on-request ones, or those named in ``sections``) and return a
    JSON-ready report.

    ``quick`` shrinks every size (32 px ResNet, a few sites and images, one repetition, no Dask section) for a
    smoke test. ``default_model`` is the small model of the ``small`` and ``dask`` workloads (skipped without
    one); ``default_model_source`` (its name or directory) lets the ``load`` section time loading it. The report
    holds the keys described in the module docstring, their targets, sizes, device, and
    ``peak_rss_MB`` (peak resident memory of the process). ``job_names`` selects the jobs of the ``jobs``
    section and ``jobs_out`` the folder that keeps their outputs (default: a temporary one);
    ``on_partial(report)`` is called with the report so far after every section and every job, so that a long
    run can save what it has measured.
    """
    device = resolve_device(device)
    names = [name for name, _ in SECTIONS]
    unknown = sorted(set(sections or ()) - set(names))
    if unknown:
        raise ConfigError(f"unknown benchmark section(s) {unknown}; sections: {names}")
    if "jobs" in (sections or ()):
        check_jobs(job_names, quick, work_dir=jobs_out)  # before the other sections: a typo shows at once
    to_run = [name for name in names if (name in sections if sections is not None else name not in ON_REQUEST_SECTIONS)]
    if default_model is not None:
        _check_default_model(default_model, to_run, quick)
    software = software_versions()
    report = {"started_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"), "quick": bool(quick),
              "device": str(device), "max_chunk_bytes": int(max_chunk_bytes),
              "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "cpu_model": _cpu_model(),
              "load_average_1min_at_start": round(os.getloadavg()[0], 2), "software": software,
              "commit": software["commit"],
              "repeats": (QUICK_SIZES if quick else FULL_SIZES)["repeats"],
              "stim_current_uA": STIM_CURRENT_UA, "stim_frequency_Hz": STIM_FREQUENCY_HZ}
    save = on_partial or (lambda partial: None)
    context = BenchContext(QUICK_SIZES if quick else FULL_SIZES, device, seed, int(max_chunk_bytes), progress,
                           None if default_model is None else default_model.to(device), default_model_source,
                           job_names, jobs_out, lambda partial: save({**report, **partial}), tuple(sections or ()))
    for name, section in SECTIONS:
        if name in to_run:
            values = section(context)
            repeated = sorted(set(values) & set(report))
            if repeated:
                raise RuntimeError(f"benchmark section {name!r} would overwrite the report's keys {repeated}")
            report.update(values)
            save(report)
    report["peak_rss_MB"] = _peak_rss_MB()
    report.update(judge_targets(report))
    return report


#: The benchmark's targets: a report entry (``section.key`` for one inside a section's dict) → (``"<="`` or
#: ``">="``, the target).
TARGETS = {"engine_over_bound_it": ("<=", TARGET_ENGINE_OVER_BOUND_IT),
           "engine_over_bound_small": ("<=", TARGET_ENGINE_OVER_BOUND_SMALL),
           "engine_vs_cached_baseline": (">=", TARGET_ENGINE_VS_CACHED_BASELINE),
           "speedup_it": (">=", TARGET_SPEEDUP_IT), "speedup_pre_it": (">=", TARGET_SPEEDUP_PRE_IT),
           "dask_2workers_vs_1": (">=", TARGET_DASK_2WORKERS_VS_1),
           "max_abs_diff_engine_vs_baseline_it": ("<=", TARGET_MAX_ABS_DIFF),
           "max_abs_diff_engine_vs_baseline_small": ("<=", TARGET_MAX_ABS_DIFF),
           "dask_max_abs_diff": ("<=", TARGET_MAX_ABS_DIFF),
           "default_model_load_and_activations.total_s": ("<=", TARGET_LOAD_AND_ACTIVATIONS_S),
           "analysis.total_s": ("<=", TARGET_ANALYSIS_S)}


def judge_targets(report: dict) -> dict:
    """``targets_missed``: ``{entry: {"value", "target"}}`` for every entry of :data:`TARGETS` the report holds and
    misses (the target as ``"<= 1.2"``); ``meets_targets``: whether it misses none, or None when the report holds
    none of them. On quick sizes nothing is judged (the targets are set for the full ones): both are None."""
    if report["quick"]:
        return {"targets_missed": None, "meets_targets": None}
    measured = {}
    for entry in TARGETS:
        value = report
        for key in entry.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            measured[entry] = float(value)
    missed = {entry: {"value": value, "target": f"{TARGETS[entry][0]} {TARGETS[entry][1]:g}"}
              for entry, value in measured.items()
              if not (value <= TARGETS[entry][1] if TARGETS[entry][0] == "<=" else value >= TARGETS[entry][1])}
    return {"targets_missed": missed, "meets_targets": not missed if measured else None}


@register_section("bound")
def bound_section(context: BenchContext) -> dict:
    """Engine against the exact lower bound and the cached baseline: IT workload (ResNet-18) and ``small``."""
    report = {"target_engine_over_bound_it": TARGET_ENGINE_OVER_BOUND_IT,
              "target_engine_over_bound_small": TARGET_ENGINE_OVER_BOUND_SMALL,
              "target_engine_vs_cached_baseline": TARGET_ENGINE_VS_CACHED_BASELINE}
    n_sites, n_images = context.sizes["it"]
    images, labels = _face_images(n_images)
    report.update({f"{k}_it": v for k, v in _against_bound(context, context.resnet, "layer4.1", images, labels,
                                                           n_sites).items()})
    report["engine_vs_cached_baseline"] = report.pop("engine_vs_cached_baseline_it")
    if context.default_model is not None:
        n_sites, n_images = context.sizes["small"]
        images, labels = _mirrored_face_images(n_images)
        it_layer = _it_layer(context.default_model)
        report.update({f"{k}_small": v for k, v in _against_bound(context, context.default_model, it_layer, images,
                                                                  labels, n_sites,
                                                                  context.sizes["small_baseline_sites"]).items()})
    return report


@register_section("plain")
def plain_section(context: BenchContext) -> dict:
    """Engine against the plain approach (speedup_it, speedup_pre_it), on the ResNet-18 and the default model."""
    report = {"target_speedup_it": TARGET_SPEEDUP_IT, "target_speedup_pre_it": TARGET_SPEEDUP_PRE_IT}
    report.update(_benchmark_model(context.resnet, "layer4.1", "layer4.0", context))
    if context.default_model is not None:
        it_layer = _it_layer(context.default_model)
        report["default_model"] = _benchmark_model(context.default_model, it_layer,
                                                   _pre_it_layer(context.default_model, it_layer), context)
    return report


@register_section("dask")
def dask_section(context: BenchContext) -> dict:
    """Wall time of one sweep on 1 and on 2 Dask worker processes (one thread each) of a local cluster.

    The sweep is the same work both ways (the same (condition, image) pairs, split into 4 chunks per worker;
    both counts are reported). It is large enough that what a run pays once — this process's forward passes
    to the perturbed layer and, for the control, to the decoder (``dask_serial_s``), sending the model and
    that activity to every worker, collecting the results (about 0.5 CPU-seconds in all) — is a few percent
    of the work (about 12 CPU-seconds on one core), so the ratio is near 2 on 2 idle cores."""
    if context.sizes["dask"] is None or context.default_model is None:
        reason = ("the quick sizes have no Dask sweep (run without --quick)" if context.sizes["dask"] is None
                  else NO_DEFAULT_MODEL)
        return {"dask_2workers_vs_1": None, "dask_note": _not_measured(context, "dask", reason)}
    from distributed import Client

    from stimsim.engine.distributed import CHUNKS_PER_THREAD, local_cluster, quiet_dask_logs

    model = context.default_model
    n_sites, n_images = context.sizes["dask"]
    images, labels = _mirrored_face_images(n_images)
    it_layer = _it_layer(model)
    layer = _dask_layer(model, it_layer)
    decoder = LogisticDecoder.fit(model.activations(images, it_layer), labels, layer=it_layer, C=DECODER_C)
    conditions = _site_conditions(model.sheet(layer), layer, n_sites, context.seed)
    chunks = {n: chunk_count(model, images, conditions, decoder, context.max_chunk_bytes, CHUNKS_PER_THREAD * n,
                             safety_override=SAFETY_OVERRIDE) for n in (1, 2)}
    start = time.perf_counter()
    serial_work(model, images, conditions, decoder, context.max_chunk_bytes, safety_override=SAFETY_OVERRIDE)
    serial_s = time.perf_counter() - start
    report_phase(f"bench: Dask sweep of {n_sites} sites × {n_images} images at {layer} on 1 and 2 workers",
                 context.progress)
    with quiet_dask_logs():  # Dask's own log lines (a client removed, ...) kept off stderr
        clusters = {n: local_cluster(n) for n in (1, 2)}
        clients = {n: Client(cluster) for n, cluster in clusters.items()}
        worker_cpu_s = {1: [], 2: []}  # per timed sweep: CPU seconds (user + system) of each worker process
        try:
            def sweep(n):
                def run():
                    before = clients[n].run(_process_cpu_s)
                    values = simulate(model, images, conditions, decoder, progress=False, scheduler=clients[n],
                                      max_chunk_bytes=context.max_chunk_bytes, device=context.device,
                                      safety_override=SAFETY_OVERRIDE).values
                    after = clients[n].run(_process_cpu_s)
                    worker_cpu_s[n].append([after[w] - before[w] for w in after])
                    return values

                return run

            for n in clients:  # workers import torch and stimsim on their first task; keep that out of the timing
                simulate(model, images[:2], conditions[:2], decoder, progress=False, scheduler=clients[n],
                         safety_override=SAFETY_OVERRIDE)
            timings = _interleaved_minimum({n: sweep(n) for n in clients}, context.sizes["repeats"], context.device)
        finally:
            for n in clients:
                clients[n].close()
                clusters[n].close()
    (one_s, one), (two_s, two) = timings[1], timings[2]
    one_cpu_s = min(sum(run) for run in worker_cpu_s[1])
    busier_cpu_s = min(max(run) for run in worker_cpu_s[2])
    return {"dask_2workers_vs_1": one_s / two_s, "dask_1worker_s": one_s, "dask_2workers_s": two_s,
            "dask_1worker_cpu_s": one_cpu_s, "dask_2workers_busier_cpu_s": busier_cpu_s,
            "dask_2workers_vs_1_cpu": one_cpu_s / busier_cpu_s,
            "dask_ideal_2workers_vs_1": one_s / (serial_s + (one_s - serial_s) / 2), "dask_serial_s": serial_s,
            "dask_chunks_1worker": chunks[1], "dask_chunks_2workers": chunks[2],
            "dask_max_abs_diff": float(np.abs(one - two).max()), "dask_sites": n_sites, "dask_images": n_images,
            "dask_layer": layer, "target_dask_2workers_vs_1": TARGET_DASK_2WORKERS_VS_1}


@register_section("load")
def load_section(context: BenchContext) -> dict:
    """Loading the default model and computing its IT activations (target: :data:`TARGET_LOAD_AND_ACTIVATIONS_S`)."""
    if context.default_model_source is None:
        _not_measured(context, "load", NO_DEFAULT_MODEL)
        return {}
    return {"default_model_load_and_activations": time_load_and_activations(context.default_model_source,
                                                                            device=context.device)}


@register_section("plan")
def plan_section(context: BenchContext) -> dict:
    """Seconds per working electrode of the 2AFC plan's phases on an ImageNet-based model (module docstring)."""
    from stimsim.paradigms.sequence_2afc import TaskSpec, fit_readouts
    from stimsim.planning.tasks.sequence_2afc import rehearse
    from stimsim.sequences import SequenceSpec, build_sequences

    sizes = context.sizes
    model = context.imagenet_model
    sheet = model.sheet("IT")
    n_sites = sizes["plan_sites"]
    rng = np.random.default_rng(context.seed)
    x0, x1, y0, y1 = sheet.extent_mm
    sites = np.column_stack([rng.uniform(x0 + 1, x1 - 1, n_sites), rng.uniform(y0 + 1, y1 - 1, n_sites)])
    natural, _ = _face_images(32)
    spec = SequenceSpec(n_sequences=3, n_steps=7, iterations=sizes["plan_iterations"], batch_images=32,
                        precision="float32")  # as experiments/plan_imagenet.toml
    decoder = TaskSpec(n_noise=16, n_eval=8)
    seconds = {}
    report_phase(f"bench: plan phases on {PLAN_MODEL}, {n_sites} site(s) at 224 px", context.progress)
    start = time.perf_counter()
    sequences = build_sequences(model, sites, natural, spec, seed=context.seed, progress=context.progress)
    _synchronize(context.device)
    seconds["sequences"] = time.perf_counter() - start
    start = time.perf_counter()
    readouts, _ = fit_readouts(model, sequences.images, None, decoder, seed=context.seed, progress=context.progress)
    _synchronize(context.device)
    seconds["decoders"] = time.perf_counter() - start
    points = np.repeat(sites[:, None], 1 + PLAN_N_BOOT, axis=1)
    start = time.perf_counter()
    rehearse(model, sequences.images, points, {"current_uA": PLAN_CURRENT_UA, "frequency_Hz": PLAN_FREQUENCY_HZ},
             readouts, decoder, seed=context.seed, progress=context.progress, device=context.device)
    _synchronize(context.device)
    seconds["rehearsal"] = time.perf_counter() - start
    per_site = {phase: value / n_sites for phase, value in seconds.items()}
    models_rehearsed = 3  # two candidates and the virtual subject
    total = PLAN_DEFAULT_SITES * (per_site["sequences"] + models_rehearsed * (per_site["decoders"] + per_site["rehearsal"]))
    return {"plan_phases": {"model": PLAN_MODEL, "n_sites": n_sites, "iterations": spec.iterations,
                            "n_sequences": spec.n_sequences, "n_steps": spec.n_steps, "n_noise": decoder.n_noise,
                            "n_eval": decoder.n_eval, "points_per_site": 1 + PLAN_N_BOOT,
                            "current_uA": PLAN_CURRENT_UA,
                            "seconds_per_site": per_site, "plan_default_sites": PLAN_DEFAULT_SITES,
                            "models_rehearsed": models_rehearsed, "plan_default_design_and_rehearsal_s": total}}


@register_section("maps")
def maps_section(context: BenchContext) -> dict:
    """Smoothed selectivity map against a loop over its points (``smoothing_vs_loop``); on the quick sizes, on
    the small default model's IT sheet."""
    if (chosen := _model_and_it_layer(context)) is None:
        _not_measured(context, "maps", NO_DEFAULT_MODEL)
        return {}
    model, layer = chosen
    sheet = model.sheet(layer)
    values = np.random.default_rng(context.seed).standard_normal(sheet.n_units)  # timing does not depend on them
    grid = sheet_grid(sheet, MAPS_GRID_STEP_MM)[2]
    n_loop = min(context.sizes["maps_loop_points"], len(grid))
    report_phase(f"bench: smoothed map of {sheet.n_units} units on {len(grid)} points (loop on {n_loop})",
                 context.progress)
    timings = _interleaved_minimum({
        "vectorised": lambda: smoothed_values_at(values, sheet, grid, MAPS_SIGMA_MM),
        "loop": lambda: looped_smoothing(values, sheet, grid[:n_loop], MAPS_SIGMA_MM),
    }, context.sizes["repeats"], torch.device("cpu"))
    (vectorised_s, vectorised), (loop_s, loop) = timings["vectorised"], timings["loop"]
    return {"maps": {"model": model.name, "units": sheet.n_units, "points": len(grid), "loop_points": n_loop,
                     "sigma_mm": MAPS_SIGMA_MM, "grid_step_mm": MAPS_GRID_STEP_MM, "vectorised_s": vectorised_s,
                     "loop_s": loop_s, "max_abs_diff": float(np.nanmax(np.abs(vectorised[:n_loop] - loop)))},
            "smoothing_vs_loop": (loop_s / n_loop) / (vectorised_s / len(grid))}


@register_section("cache")
def cache_section(context: BenchContext) -> dict:
    """Reading IT activity back from the activation cache against computing it (``cache_reuse_vs_forward``,
    ``cache_store_over_forward``); on the quick sizes, on the small default model."""
    from stimsim.engine.activation_cache import cached_activations

    if (chosen := _model_and_it_layer(context)) is None:
        _not_measured(context, "cache", NO_DEFAULT_MODEL)
        return {}
    model, layer = chosen
    images, _ = _face_images(context.sizes["cache_images"])
    report_phase(f"bench: activation cache of {model.name}'s {layer}, {len(images)} images", context.progress)
    model.activations(images[:2], layer)  # first calls pay one-off allocations; keep them out of timing
    with tempfile.TemporaryDirectory() as directory:
        rounds = itertools.count()  # every storing call gets a new, empty folder
        timings = _interleaved_minimum({
            "forward": lambda: model.activations(images, layer),
            "store": lambda: cached_activations(model, images, layer, Path(directory) / str(next(rounds))),
            "reuse": lambda: cached_activations(model, images, layer, Path(directory) / "0"),
        }, context.sizes["repeats"], context.device)
        entry_MB = sum(path.stat().st_size for path in (Path(directory) / "0").iterdir()) / 1e6
    (forward_s, forward), (store_s, _), (reuse_s, reused) = timings["forward"], timings["store"], timings["reuse"]
    return {"cache": {"model": model.name, "layer": layer, "images": len(images), "forward_s": forward_s,
                      "store_s": store_s, "reuse_s": reuse_s, "entry_MB": entry_MB,
                      "max_abs_diff": float((forward - reused.cpu()).abs().max())},
            "cache_reuse_vs_forward": forward_s / reuse_s, "cache_store_over_forward": store_s / forward_s}


#: Why a section of the small default model measures nothing without one.
NO_DEFAULT_MODEL = "there is no default model (give --model NAME)"


def _not_measured(context: BenchContext, section: str, reason: str) -> str:
    """Warn, when ``section`` was named, that it measured nothing and why; returns the report's note."""
    if section in context.named:
        warnings.warn(f"bench: section {section!r} was not measured: {reason}", stacklevel=2)
    return f"not measured: {reason}"


def _model_and_it_layer(context: BenchContext) -> tuple[TopographicModel, str] | None:
    """The model of the ``maps`` and ``cache`` sections and its IT layer: :data:`PLAN_MODEL`, or on the quick sizes
    the small default model (None without one)."""
    if context.sizes is not QUICK_SIZES:
        return context.imagenet_model, "IT"
    if context.default_model is None:
        return None
    return context.default_model, _it_layer(context.default_model)


@register_section("analysis")
def analysis_section(context: BenchContext) -> dict:
    """Time of ``stimsim analyze`` on a planted session (:func:`time_analysis`)."""
    return {"analysis": time_analysis(quick=context.sizes is QUICK_SIZES, seed=context.seed)}


@register_section("jobs", on_request=True)
def jobs_section(context: BenchContext) -> dict:
    """The README's jobs as a user runs them: wall time, CPU time, peak memory (:mod:`stimsim.engine.jobs_bench`)."""
    from stimsim.engine.jobs_bench import time_jobs

    return time_jobs(context.job_names, quick=context.sizes is QUICK_SIZES, work_dir=context.jobs_out,
                     progress=context.progress, on_result=context.on_job)


def cached_baseline(model, images, conditions, decoder, layer: str, chunk_bytes: int = BASELINE_CHUNK_BYTES):
    """What a competent user writes without the engine: cache the activations of ``layer`` once, then for each
    chunk of conditions build their effects, perturb the cached activity of every image, and decode.
    Returns probabilities (conditions, images, choices) as float64."""
    inputs = model.preprocess(images)
    with torch.no_grad():
        activity = torch.cat([model.run_stages(inputs[i:i + 64], stop=layer).flatten(1)
                              for i in range(0, len(inputs), 64)])
    sheet = model.sheet(layer)
    per_chunk = max(1, chunk_bytes // (activity.numel() * activity.element_size()))
    out = []
    for start in range(0, len(conditions), per_chunk):
        effects = [condition.effect(sheet) for condition in conditions[start:start + per_chunk]]
        gain = torch.tensor(np.stack([e.multiplier for e in effects]), dtype=activity.dtype, device=activity.device)
        shift = torch.tensor(np.stack([e.additive for e in effects]), dtype=activity.dtype, device=activity.device)
        perturbed = activity[None] * gain[:, None, :] + shift[:, None, :]
        with torch.no_grad():
            out.append(decoder.probabilities(perturbed).cpu())
    return torch.cat(out).double().numpy()


def looped_smoothing(values, sheet: CorticalSheet, points_mm, sigma_mm: float) -> np.ndarray:
    """The Gaussian-weighted mean of ``values`` around each point written as a loop over the points: the units
    within 3σ from one k-d tree query, then their weights (what :func:`smoothed_values_at` computes)."""
    from scipy.spatial import cKDTree

    result = np.full(len(points_mm), np.nan)
    for i, neighbours in enumerate(cKDTree(sheet.coordinates_mm).query_ball_point(points_mm, 3 * sigma_mm)):
        if neighbours:
            squared_mm2 = np.sum((sheet.coordinates_mm[neighbours] - points_mm[i]) ** 2, axis=1)
            weights = np.exp(-squared_mm2 / (2 * sigma_mm ** 2))
            result[i] = np.dot(weights, values[neighbours]) / weights.sum()
    return result


def lower_bound(model, images, layer: str, weighted: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """The work no exact method can skip: the forward pass from the images to ``layer`` and one matrix product
    of the weighted effects (rows, units) with the activity (units, images)."""
    inputs = model.preprocess(images)
    with torch.no_grad():
        activity = torch.cat([model.run_stages(inputs[i:i + batch_size], stop=layer).flatten(1)
                              for i in range(0, len(inputs), batch_size)])
    return weighted @ activity.T


def time_load_and_activations(model_name: str, n_images: int = 100, device="cpu") -> dict:
    """Seconds to load a (shipped) model from disk, checksums included, and to compute its IT
    activations for ``n_images`` images (target for the shipped models: under 5 s on 2 cores)."""
    from stimsim.models.registry import load_model

    images, _ = _face_images(n_images)
    start = time.perf_counter()
    model = load_model(model_name, device=device)
    loaded = time.perf_counter()
    it_layer = _it_layer(model)
    model.activations(images, it_layer)
    done = time.perf_counter()
    return {"model": model_name, "n_images": n_images, "load_s": loaded - start, "activations_s": done - loaded,
            "total_s": done - start}


def _against_bound(context: BenchContext, model, layer: str, images, labels, n_sites: int,
                   baseline_sites: int | None = None) -> dict:
    """Engine, cached baseline and lower bound on one workload, interleaved; ratios and largest differences.
    With ``baseline_sites``, the baseline runs on the first that many sites only and is compared by site·image
    pairs per second (its cost after the forward pass is linear in sites; the ratio then slightly favours
    the engine, whose forward pass is spread over more sites)."""
    baseline_sites = n_sites if baseline_sites is None else min(baseline_sites, n_sites)
    report_phase(f"bench: {model.name}, {n_sites} sites × {len(images)} images at {layer} (engine, cached baseline "
                 f"and lower bound, {context.sizes['repeats']} rounds)", context.progress)
    decoder = LogisticDecoder.fit(model.activations(images, layer), labels, layer=layer, C=DECODER_C)
    conditions = _site_conditions(model.sheet(layer), layer, n_sites, context.seed)
    weight, _ = decoder.linear_weights(context.device)
    multiplier, _ = Condition.batch_effects(conditions, model.sheet(layer), context.device)
    relative = (weight[1:] - weight[0]).to(torch.float32)
    weighted = ((multiplier - 1.0).to(torch.float32)[:, None, :] * relative[None]).reshape(-1, relative.shape[1])
    model.run_stages(model.preprocess(images[:2]))  # first calls pay one-off allocations; keep them out of timing
    timings = _interleaved_minimum({
        "engine": lambda: simulate(model, images, conditions, decoder, progress=False, device=context.device,
                                   max_chunk_bytes=context.max_chunk_bytes, safety_override=SAFETY_OVERRIDE).values,
        "baseline": lambda: cached_baseline(model, images, conditions[:baseline_sites], decoder, layer),
        "bound": lambda: lower_bound(model, images, layer, weighted),
    }, context.sizes["repeats"], context.device)
    (engine_s, engine), (baseline_s, baseline), (bound_s, _) = timings["engine"], timings["baseline"], timings["bound"]
    return {"engine_over_bound": engine_s / bound_s,
            "engine_vs_cached_baseline": (baseline_s / baseline_sites) / (engine_s / n_sites),
            "max_abs_diff_engine_vs_baseline": float(np.abs(engine[:baseline_sites] - baseline).max()),
            "engine_beside_bound_s": engine_s, "cached_baseline_s": baseline_s, "cached_baseline_sites": baseline_sites,
            "bound_s": bound_s, "sites": n_sites,
            "images": len(images), "stimulated_layer": layer, "units": int(multiplier.shape[1]), "model": model.name}


def _interleaved_minimum(functions: dict, repeats: int, device: torch.device) -> dict:
    """name → (minimum seconds over ``repeats`` rounds, output of the last call); each round calls every
    function once, in turn, so that a slow period of a shared machine hits them all alike."""
    best = {name: (float("inf"), None) for name in functions}
    for _ in range(max(1, repeats)):
        for name, function in functions.items():
            _synchronize(device)
            start = time.perf_counter()
            output = function()
            _synchronize(device)
            seconds = time.perf_counter() - start
            best[name] = (min(best[name][0], seconds), output)
    return best


def _process_cpu_s() -> float:
    """CPU seconds (user + system) this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _benchmark_model(model: TopographicModel, it_layer: str, pre_it_layer: str, context: BenchContext) -> dict:
    """Both workloads on one model; the decoder reads ``it_layer`` in both."""
    sizes = context.sizes
    n_images = max(sizes["it"][1], sizes["pre_it"][1])
    images, labels = _face_images(n_images)
    decoder = LogisticDecoder.fit(model.activations(images, it_layer), labels, layer=it_layer, C=DECODER_C)
    result = {"model": model.name, "image_size_px": model.preprocessing.size_px, "it_layer": it_layer,
              "pre_it_layer": pre_it_layer, "decoder_layer": it_layer, "n_plain_sites": sizes["n_plain_sites"]}
    for key, layer in (("it", it_layer), ("pre_it", pre_it_layer)):
        n_sites, n_workload_images = sizes[key]
        timing = _measure(model, images[:n_workload_images], layer, decoder, n_sites, sizes["n_plain_sites"],
                          context)
        result.update({f"{name}_{key}": value for name, value in timing.items()})
    return result


def _measure(model, images, layer, decoder, n_sites, n_plain_sites, context: BenchContext) -> dict:
    """Engine on every site and plain on the first ``n_plain_sites``; rates, speedup and largest difference."""
    report_phase(f"bench: {model.name}, {n_sites} sites × {len(images)} images at {layer} (engine, then plain "
                 f"on {n_plain_sites} sites)", context.progress)
    conditions = _site_conditions(model.sheet(layer), layer, n_sites, context.seed)
    model.run_stages(model.preprocess(images[:2]))  # first calls pay one-off allocations; keep them out of timing
    timings = _interleaved_minimum({
        "engine": lambda: simulate(model, images, conditions, decoder, max_chunk_bytes=context.max_chunk_bytes,
                                   progress=context.progress, device=context.device,
                                   safety_override=SAFETY_OVERRIDE).values,
        "plain": lambda: simulate_plain(model, images, conditions[:n_plain_sites], decoder, progress=context.progress,
                                        device=context.device, safety_override=SAFETY_OVERRIDE).values,
    }, 1, context.device)
    (engine_s, engine_values), (plain_s, plain_values) = timings["engine"], timings["plain"]
    engine_rate = n_sites * len(images) / engine_s
    plain_rate = n_plain_sites * len(images) / plain_s
    return {
        "speedup": engine_rate / plain_rate,
        "max_abs_diff": float(np.abs(engine_values[:n_plain_sites] - plain_values).max()),
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


def _it_layer(model: TopographicModel) -> str:
    """The IT layer: the layer labelled "IT", else the readout layer (it must have a cortical sheet)."""
    try:
        it_layer = model.resolve_layer("IT")
    except ConfigError:
        it_layer = model.readout_layer
    model.sheet(it_layer)
    return it_layer


def _pre_it_layer(model: TopographicModel, it_layer: str) -> str:
    """The topographic layer before ``it_layer``, which the pre-IT workload stimulates."""
    earlier = [layer for layer in model.layers if model.stage_names.index(layer) < model.stage_names.index(it_layer)]
    if not earlier:
        raise ConfigError(f"model {model.name!r} has no topographic layer before its IT layer {it_layer!r}; "
                          f"the pre-IT workload of the plain section needs one (topographic layers: {model.layers}): "
                          "give --model a model with one, or --sections without plain")
    return earlier[-1]


def _dask_layer(model: TopographicModel, it_layer: str) -> str:
    """The layer the Dask sweep stimulates: the stage two before ``it_layer`` (each (condition, image) pair runs
    both), which must have a cortical sheet."""
    index = model.stage_names.index(it_layer) - 2
    layer = model.stage_names[index] if index >= 0 else None
    if layer not in model.sheets:
        raise ConfigError(f"model {model.name!r} has no topographic layer two stages before its IT layer "
                          f"{it_layer!r} (stages: {model.stage_names}; topographic layers: {model.layers}); the dask "
                          "section stimulates one: give --model a model with one, or --sections without dask")
    return layer


def _check_default_model(model: TopographicModel, sections: list[str], quick: bool) -> None:
    """Refuse, before any section runs, a default model that one of ``sections`` cannot measure: an IT layer with a
    sheet (``bound``, ``plain``, ``dask``, ``load``; ``maps`` and ``cache`` on the quick sizes), a topographic layer
    before it (``plain``) and one two stages before it (``dask``, which the quick sizes skip)."""
    if not ({"bound", "plain", "dask", "load"} | ({"maps", "cache"} if quick else set())) & set(sections):
        return
    it_layer = _it_layer(model)
    if "plain" in sections:
        _pre_it_layer(model, it_layer)
    if "dask" in sections and (QUICK_SIZES if quick else FULL_SIZES)["dask"] is not None:
        _dask_layer(model, it_layer)


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


def _mirrored_face_images(n_images: int) -> tuple[np.ndarray, np.ndarray]:
    """Up to 800 images: the 200 of :func:`_face_images`, then the same mirrored left-right, up-down and both."""
    images, labels = _face_images(200)
    views = [images, images[:, :, ::-1], images[:, ::-1, :], images[:, ::-1, ::-1]]
    if not 2 <= n_images <= 200 * len(views):
        raise ConfigError(f"the mirrored image set has 2 to {200 * len(views)} images, got {n_images}")
    return np.ascontiguousarray(np.concatenate(views)[:n_images]), np.tile(labels, len(views))[:n_images]


def _cpu_model() -> str | None:
    """The processor's name as ``/proc/cpuinfo`` gives it (Linux), else :func:`platform.processor`, else None."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or None


def _peak_rss_MB() -> float:
    """Peak resident memory of this process, MB."""
    return max_rss_MB(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


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

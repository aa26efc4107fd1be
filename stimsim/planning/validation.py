"""Closed-loop validation of plans on virtual subjects (``stimsim plan CONFIG --validate N``).

For each of N hidden poses (the plan's virtual subject made again with seeds base + 101·k, which redraws
its pose, dead electrodes and gains) the whole plan runs without being told the pose, and the planned
ΔAUC of every working electrode is correlated (Pearson r) with the subject's true ΔAUC: the same
sequences, the subject's own frozen decoders, stimulation at the electrode's true sheet position.

Null ("random registrations"): effects are spatially smooth, so a registration that is wrong can still
correlate by chance. For each pose, ``n_random`` (≥ 100) random rigid poses of the array relative to the
fitted one are drawn (rotation uniform in [0, 360)°, translation uniform within ± half the array's width
on each axis); each electrode then takes the planned ΔAUC of the electrode nearest to where the random
pose sends it (array frame; pairs further than 0.75 pitch from any electrode — off the planned
footprint — are dropped, and a draw keeping fewer than half of the electrodes is redrawn). The r of these
re-mapped plans against the true ΔAUC forms the null; ``random_pose_r_p95`` is its 95th percentile. This
is a spin test (Alexander-Bloch et al. 2018, NeuroImage 175:111) on the array: it keeps the planned
map's spatial smoothness; it does not re-plan sequences for the random poses.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.spatial import cKDTree
from tqdm.auto import tqdm

from stimsim.config import load_toml
from stimsim.io import atomic_write_json

TARGET_R = 0.5


def random_pose_null(array_xy_mm: np.ndarray, predicted: np.ndarray, true: np.ndarray, n_random: int = 200,
                     seed: int = 0) -> np.ndarray:
    """Pearson r of spatially re-mapped plans against ``true`` for ``n_random`` random rigid poses."""
    xy = np.asarray(array_xy_mm, dtype=np.float64)
    tree = cKDTree(xy)
    pitch = float(np.median(tree.query(xy, k=2)[0][:, 1]))
    centre = xy.mean(0)
    half_width = (xy.max(0) - xy.min(0)) / 2
    rng = np.random.default_rng([seed, 0x5917])
    values = []
    attempts = 0
    while len(values) < n_random and attempts < 50 * n_random:
        attempts += 1
        theta = rng.uniform(0, 2 * np.pi)
        rotation = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
        moved = (xy - centre) @ rotation.T + centre + rng.uniform(-half_width, half_width)
        distance, nearest = tree.query(moved)
        keep = distance <= 0.75 * pitch
        if keep.sum() < max(3, len(xy) // 2):
            continue
        a, b = predicted[nearest[keep]], true[keep]
        if a.std() == 0 or b.std() == 0:
            continue
        values.append(float(np.corrcoef(a, b)[0, 1]))
    return np.asarray(values)


def validate_plan(config, out_dir: Path, n_poses: int, progress: bool = True, n_random: int = 200,
                  compute: dict | None = None) -> dict:
    """Plan for ``n_poses`` hidden poses of the virtual subject; writes ``out_dir/validation.json``.
    ``compute``: device and scheduler of every plan (see :func:`stimsim.planning.plan.plan_once`)."""
    from stimsim.planning.plan import plan_once

    if n_poses < 1:
        raise ValueError(f"--validate needs a number of poses >= 1, got {n_poses}")
    base_seed = int(load_toml(config.subject_config)["subject"]["seed"])
    per_pose, nulls, details = [], [], []
    for k in tqdm(range(n_poses), desc="validation poses", unit="pose", disable=not progress):
        seed = base_seed + 101 * (k + 1)
        pose_dir = out_dir / "validation" / f"pose_{k}"
        summary = plan_once(config, pose_dir, progress, subject_seed=seed, write_report=False, compute=compute)
        sites = _sites(pose_dir)
        alive = [e for e in summary["true_delta_auc"] if e not in set(summary["dead_electrodes_rehearsed"])
                 and np.isfinite(summary["predicted_delta_auc"][e])]
        predicted = np.array([summary["predicted_delta_auc"][e] for e in alive])
        true = np.array([summary["true_delta_auc"][e] for e in alive])
        xy = np.array([sites[e] for e in alive])
        null = random_pose_null(xy, predicted, true, n_random=n_random, seed=seed)
        truth = json.loads((pose_dir / "subject" / "truth.json").read_text())
        per_pose.append(summary["predicted_vs_true_r"])
        nulls.append(float(np.percentile(null, 95)))
        details.append({"subject_seed": seed, "pose": truth["pose"], "predicted_vs_true_r": summary["predicted_vs_true_r"],
                        "predicted_vs_true_r_per_model": summary["predicted_vs_true_r_per_model"],
                        "random_pose_r_p95": nulls[-1], "random_pose_r_median": float(np.median(null)),
                        "n_random": int(len(null)), "n_electrodes": len(alive), "chosen_model": summary["chosen_model"],
                        "predicted_delta_auc_median": summary["predicted_delta_auc_median"],
                        "true_delta_auc_median": summary["true_delta_auc_median"]})
    result = {"predicted_vs_true_r": float(np.median(per_pose)), "predicted_vs_true_r_per_pose": per_pose,
              "random_pose_r_p95": nulls, "n_poses": n_poses,
              "poses_above_random_p95": int(sum(r > p for r, p in zip(per_pose, nulls))),
              "target": {"predicted_vs_true_r_at_least": TARGET_R, "poses_above_random_p95_at_least": 4,
                         "n_poses": 5},
              "null_method": "random rigid re-mapping of the planned map on the array (spin test), see "
                             "stimsim.planning.validation",
              "poses": details}
    atomic_write_json(out_dir / "validation.json", result)
    return result


def _sites(plan_dir: Path) -> dict:
    import pandas as pd

    table = pd.read_csv(plan_dir / "sites.csv", dtype={"electrode_id": str})
    return {row.electrode_id: (row.array_x_mm, row.array_y_mm) for row in table.itertuples(index=False)}

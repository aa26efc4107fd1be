"""Closed-loop validation of plans on virtual subjects (``stimsim plan CONFIG --validate N``).

For each of N hidden poses (the plan's virtual subject made again with seeds base + 101·k, which redraws
its pose, dead electrodes and gains) the whole plan runs without being told the pose, and the planned
ΔAUC of every working electrode is correlated (Pearson r) with the subject's true ΔAUC: the same
sequences, the subject's own frozen decoders, stimulation at the electrode's true sheet position.

Null ("random registrations"): effects are spatially smooth, so a registration that is wrong can still
correlate by chance. For each pose, every candidate model also rehearses the same sequences at
``n_random`` (≥ 100) random registrations of the array on its sheet (rotation uniform in [0, 360)°,
centre uniform among the positions where the array lies on the sheet); the plan made at each random
registration (mean over candidates, as the plan itself) is correlated with the true ΔAUC, and
``random_pose_r_p95`` is the 95th percentile of these r. A pose passes when its r exceeds its own null's
95th percentile.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from stimsim.planning.plan import plan_once
from stimsim.utilities.config import load_toml
from stimsim.utilities.errors import ConfigError
from stimsim.utilities.io import atomic_write_json, provenance

#: Targets of the closed loop (as the paper reached against monkeys): median r over 5 poses and the number of poses above their null's 95th percentile.
TARGET_R = 0.5
TARGET_POSES_ABOVE_NULL = 4
TARGET_N_POSES = 5
MIN_RANDOM = 100


def validate_plan(config, out_dir: Path, n_poses: int, progress: bool = True, n_random: int = MIN_RANDOM,
                  compute: dict | None = None) -> dict:
    """Plan for ``n_poses`` hidden poses of the virtual subject; writes ``out_dir/validation.json`` and returns it.

    ``config`` is a :class:`stimsim.planning.config.PlanConfig` with a virtual subject made from a file;
    ``compute``: device and scheduler of every plan (see :func:`stimsim.planning.plan.plan_once`)."""
    if n_poses < 1:
        raise ConfigError(f"--validate needs a number of poses >= 1, got {n_poses}")
    if n_random < MIN_RANDOM:
        raise ConfigError(f"the random-registration null needs at least {MIN_RANDOM} poses, got {n_random}")
    if config.subject_config is None:
        raise ConfigError(f"{config.path}: validation needs a virtual subject made from a file ([subject] config = ...)")
    base_seed = int(load_toml(config.subject_config)["subject"]["seed"])
    per_pose, nulls, details = [], [], []
    for k in tqdm(range(n_poses), desc="validation poses", unit="pose", disable=not progress):
        seed = base_seed + 101 * (k + 1)
        pose_dir = Path(out_dir) / "validation" / f"pose_{k}"
        summary = plan_once(config, pose_dir, progress, subject_seed=seed, write_report=False, compute=compute,
                            n_random_poses=n_random)
        truth = json.loads((pose_dir / "subject" / "truth.json").read_text())
        per_pose.append(summary["predicted_vs_true_r"])
        nulls.append(summary["random_pose_r_p95"])
        details.append({"subject_seed": seed, "pose": truth["pose"], "predicted_vs_true_r": summary["predicted_vs_true_r"],
                        "predicted_vs_true_r_per_model": summary["predicted_vs_true_r_per_model"],
                        "random_pose_r_p95": summary["random_pose_r_p95"],
                        "random_pose_r_median": summary["random_pose_r_median"],
                        "n_random": summary["n_random_poses"], "n_electrodes": summary["n_rehearsed"]
                        - len(summary["dead_electrodes_rehearsed"]), "chosen_model": summary["chosen_model"],
                        "registration": summary["registration"],
                        f"predicted_{config.effect}_median": summary[f"predicted_{config.effect}_median"],
                        f"true_{config.effect}_median": summary[f"true_{config.effect}_median"]})
    above = int(sum(r > p for r, p in zip(per_pose, nulls)))
    result = {"predicted_vs_true_r": float(np.median(per_pose)), "predicted_vs_true_r_per_pose": per_pose,
              "random_pose_r_p95": nulls, "n_poses": n_poses, "poses_above_random_p95": above,
              "target": {"predicted_vs_true_r_at_least": TARGET_R,
                         "poses_above_random_p95_at_least": TARGET_POSES_ABOVE_NULL, "n_poses": TARGET_N_POSES},
              "targets_met": meets_targets(per_pose, nulls),
              "null_method": f"{n_random} random registrations of the array on every candidate's sheet, the same "
                             "sequences rehearsed there (see stimsim.planning.validation)",
              "poses": details,
              "provenance": _provenance(config, n_poses, n_random, base_seed, compute)}
    atomic_write_json(Path(out_dir) / "validation.json", result)
    return result


def _provenance(config, n_poses: int, n_random: int, base_seed: int, compute: dict | None) -> dict:
    """The plan's parameters and the validation's own, software versions, time, device, scheduler and input files."""
    compute = compute or {}
    record = provenance({**config.to_dict(), "validation": {"n_poses": n_poses, "n_random": n_random,
                                                            "subject_seeds": [base_seed + 101 * (k + 1)
                                                                              for k in range(n_poses)]}})
    record["device"] = str(compute.get("device", "cpu"))
    record["scheduler"] = compute.get("scheduler_description")
    record["input_sha256"] = config.input_files()
    return record


def meets_targets(per_pose_r, per_pose_null_p95) -> bool:
    """The closed loop's targets on ``TARGET_N_POSES`` poses: median r ≥ ``TARGET_R`` and r above its null's 95th
    percentile in at least ``TARGET_POSES_ABOVE_NULL`` poses (scaled to the number of poses given)."""
    n = len(per_pose_r)
    needed = int(np.ceil(TARGET_POSES_ABOVE_NULL * n / TARGET_N_POSES))
    above = sum(r > p for r, p in zip(per_pose_r, per_pose_null_p95))
    return bool(n > 0 and np.median(per_pose_r) >= TARGET_R and above >= needed)

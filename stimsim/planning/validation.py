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

Pooled over poses: ``pooled_r`` is the Pearson r of planned against true ΔAUC over every pose's electrodes
together, and ``pooled_permutation_p`` its one-sided permutation p (planned values shuffled among the electrodes
of the same pose, ``N_PERMUTATIONS`` times; p = (1 + #{r_perm ≥ r}) / (1 + N_PERMUTATIONS)). Shuffling treats
electrodes as exchangeable, which spatially smooth effects are not: the random-registration null above is the
test of the registration, the pooled p that of the association across poses.
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
#: Shuffles of the pooled permutation test (its smallest p is 1 / (1 + N_PERMUTATIONS)).
N_PERMUTATIONS = 10_000


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
    per_pose, nulls, details, pairs = [], [], [], []
    for k in tqdm(range(n_poses), desc="validation poses", unit="pose", disable=not progress):
        seed = base_seed + 101 * (k + 1)
        pose_dir = Path(out_dir) / "validation" / f"pose_{k}"
        summary = plan_once(config, pose_dir, progress, subject_seed=seed, write_report=False, compute=compute,
                            n_random_poses=n_random)
        truth = json.loads((pose_dir / "subject" / "truth.json").read_text())
        pairs.append(_alive_pairs(summary, config.effect))
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
              **pooled_permutation(pairs, seed=config.seed),
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


def _alive_pairs(summary: dict, effect: str) -> tuple[np.ndarray, np.ndarray]:
    """(planned, true) effect of one pose's electrodes that are alive in the subject and have both values."""
    dead = set(summary["dead_electrodes_rehearsed"])
    planned, true = summary[f"predicted_{effect}"], summary[f"true_{effect}"]
    electrodes = [e for e in planned if e not in dead and np.isfinite(planned[e]) and np.isfinite(true[e])]
    return np.array([planned[e] for e in electrodes]), np.array([true[e] for e in electrodes])


def pooled_permutation(pairs, seed: int = 0, n_permutations: int = N_PERMUTATIONS) -> dict:
    """``pooled_r`` of planned against true effects over every pose's (planned, true) pairs together and its
    one-sided permutation p, planned values shuffled within each pose (module docstring); None with fewer than 3
    pairs or no spread."""
    planned = np.concatenate([p for p, _ in pairs]) if pairs else np.empty(0)
    true = np.concatenate([t for _, t in pairs]) if pairs else np.empty(0)
    result = {"pooled_r": None, "pooled_permutation_p": None, "pooled_n_electrodes": int(planned.size),
              "pooled_n_permutations": n_permutations}
    if planned.size < 3 or np.ptp(planned) == 0 or np.ptp(true) == 0:
        return result
    observed = float(np.corrcoef(planned, true)[0, 1])
    rng = np.random.default_rng([seed, 0x9E7])
    bounds = np.cumsum([0] + [len(p) for p, _ in pairs])
    shuffled = np.empty((n_permutations, planned.size))
    for begin, end in zip(bounds[:-1], bounds[1:]):
        shuffled[:, begin:end] = rng.permuted(np.broadcast_to(planned[begin:end], (n_permutations, end - begin)), axis=1)
    centred = shuffled - shuffled.mean(1, keepdims=True)
    true_centred = true - true.mean()
    r = centred @ true_centred / (np.linalg.norm(centred, axis=1) * np.linalg.norm(true_centred))
    result.update(pooled_r=observed, pooled_permutation_p=float((1 + np.sum(r >= observed)) / (1 + n_permutations)))
    return result


def meets_targets(per_pose_r, per_pose_null_p95) -> bool:
    """The closed loop's targets on ``TARGET_N_POSES`` poses: median r ≥ ``TARGET_R`` and r above its null's 95th
    percentile in at least ``TARGET_POSES_ABOVE_NULL`` poses (scaled to the number of poses given)."""
    n = len(per_pose_r)
    needed = int(np.ceil(TARGET_POSES_ABOVE_NULL * n / TARGET_N_POSES))
    above = sum(r > p for r, p in zip(per_pose_r, per_pose_null_p95))
    return bool(n > 0 and np.median(per_pose_r) >= TARGET_R and above >= needed)

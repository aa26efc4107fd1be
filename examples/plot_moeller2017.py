"""
Moeller et al. 2017 on the default model
========================================

``experiments/moeller2017.toml`` as it ships, run on the default model ``stimsim-mnv2-s0`` whenever this
documentation is built (about a minute on one core), so the figures below are computed, not copied:
same/different identity judgements on the authors' 191 faces and 84 object views, a frozen same/different
decoder on IT, and 300 µA, 150 Hz during the second image at the centre of the model's face patch and at the
least face-selective point at least 3 mm away. In the monkeys, stimulating inside a face patch turned "same"
faces into "different" (the "same"-hit rate fell by 0.73) while stimulating outside barely did (0.05). The
images and the monkeys' counts come from the published data mirror (``STIMSIM_MIRROR_DIR``).
"""
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

from stimsim.paradigms.scoring import benchmark_experiments, score_model, score_table
from stimsim.utilities.errors import DataError

ROOT = Path(__file__).resolve().parents[1] if "__file__" in globals() else Path.cwd().parent
out = Path(tempfile.mkdtemp())
try:
    moeller = [path for path in benchmark_experiments(ROOT) if path.stem == "moeller2017"]
    scores = score_model("stimsim-mnv2-s0", moeller, out, progress=False)
except DataError as exc:  # the Moeller images and counts come from the data mirror
    scores = None
    print(f"not run on this machine: {exc}")

# %%
# The "same"-hit drops (hit rate without stimulation − with it), the model's beside the monkeys' (both monkeys
# pooled; the paper has no object trials outside the face patches). Targets for a model that stands in for the
# animals: a drop of at least 0.5 inside the face patch, at most 0.1 outside, and objects less affected than
# faces.
DROPS = {"faces, inside": "same_hit_drop_inside", "faces, outside": "same_hit_drop_outside",
         "objects, inside": "object_same_hit_drop_inside"}
if scores is not None:
    effects = scores["experiments"][0]["effects"]
    model = [effects["model_" + key] for key in DROPS.values()]
    monkeys = [effects["data_" + key] for key in DROPS.values()]
    print(f"{'same-hit drop':22s} {'model':>7s} {'monkeys':>8s}")
    for name, ours, theirs in zip(DROPS, model, monkeys):
        print(f"{name:22s} {ours:7.3f} {theirs:8.3f}")

# %%
# The score sets the model's agreement with the monkeys' table beside what a replicate of the monkeys' own
# experiment reaches (the ceiling) and what a model whose stimulation changes nothing reaches (chance).
if scores is not None:
    table = score_table(scores)
    print(table[["metric", "score", "ceiling", "chance", "normalized"]].round(3).to_string(index=False))

# %%
# The same drops drawn side by side; the dashed lines mark the targets (inside ≥ 0.5, outside ≤ 0.1). The run
# folder also holds the full comparison figure (``moeller2017_comparison.png``: every hit rate, with and without
# stimulation).
if scores is not None:
    positions = range(len(DROPS))
    fig, ax = plt.subplots(figsize=(5.5, 3.0))
    ax.bar([x - 0.2 for x in positions], model, 0.4, label="stimsim-mnv2-s0")
    ax.bar([x + 0.2 for x in positions], monkeys, 0.4, label="monkeys", color="tab:red")
    for target in (0.5, 0.1):
        ax.axhline(target, color="k", lw=0.8, ls="--")
    ax.set_xticks(list(positions), list(DROPS))
    ax.set_ylabel('"same"-hit drop (without − with)')
    ax.legend(frameon=False)
    fig.tight_layout()
    plt.show()

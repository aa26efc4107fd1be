"""
Score a model on the published experiments
==========================================

Before planning, a lab compares candidate models the way Brain-Score compares networks: each published
experiment (``experiments/afraz2006.toml``, ``experiments/moeller2017.toml``) runs on the model, and its
published dataset turns the result into a score with its ceiling (what the animals' own data reach) and its
chance level. ``stimsim models score stimsim-mnv2-s0 --out DIR`` from the repository's root scores every
published experiment; here the default model is scored on Afraz et al. 2006 alone (``stimsim models score
stimsim-mnv2-s0 experiments/afraz2006.toml``), with the shipped file as it is, so the numbers below are
computed when this page is built (under 2 minutes on one core): this is Afraz et al. 2006 on the default model,
and the example "Moeller et al. 2017 on the default model" runs the other published experiment. The images
come from the published data mirror (``STIMSIM_MIRROR_DIR``).
"""
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

from stimsim.paradigms.scoring import benchmark_experiments, score_model, score_table
from stimsim.utilities.errors import DataError

ROOT = Path(__file__).resolve().parents[1] if "__file__" in globals() else Path.cwd().parent
out = Path(tempfile.mkdtemp())
try:
    afraz = [path for path in benchmark_experiments(ROOT) if path.stem == "afraz2006"]
    scores = score_model("stimsim-mnv2-s0", afraz, out, progress=False)
    table = score_table(scores)
    print(table[["experiment", "metric", "score", "ceiling", "chance", "normalized"]].round(3).to_string(index=False))
except DataError as exc:  # the fLoc and Moeller images come from the data mirror
    scores = None
    print(f"not run on this machine: {exc}")

# %%
# The raw effects behind the score, the model's beside the animals' (``effects`` in ``scores.json``):
# Afraz et al. 2006 report the correlation of the psychometric shift with the site's face selectivity and the
# mean shifts (% visual signal) at face-selective and other sites.
if scores is not None:
    for entry in scores["experiments"]:
        print(entry["experiment"])
        for key, value in entry["effects"].items():
            print(f"  {key:40s} {'undefined' if value is None else format(value, '.3g')}")

# %%
# Normalized score = (score − chance) / (ceiling − chance): 0 is chance, 1 is as good as the animals' own data
# agree with themselves.
if scores is not None:
    fig, ax = plt.subplots(figsize=(5.0, 2.4))
    ax.barh(table["experiment"], table["normalized"], color="tab:blue")
    ax.axvline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xlabel("normalized score (0 chance, 1 ceiling)")
    ax.set_title("stimsim-mnv2-s0 on Afraz et al. 2006", fontsize=9)
    fig.tight_layout()
    plt.show()

# %%
# The replication behind the score, the run's own comparison figure: each site's psychometric shift against its
# face selectivity, the model's 86 sites beside the monkeys' 86 (d′ > 1 marks a face-selective site).
if scores is not None:
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    ax.imshow(plt.imread(out / "afraz2006" / "afraz2006_comparison.png"))
    ax.set_axis_off()
    fig.tight_layout()
    plt.show()

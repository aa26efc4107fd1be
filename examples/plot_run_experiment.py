"""
Run an experiment
=================

An experiment is a TOML file (``experiments/afraz2006.toml`` is the full Afraz et al. 2006
reproduction). Here a small version of it runs on the default model ``stimsim-mnv2-s0`` (a topographic IT
on MobileNetV2's ImageNet trunk): face / non-face categorisation of noisy fLoc photographs the model's
training held out, 50 µA at four face-selective and four other IT sites. The images come from the published
data mirror (``STIMSIM_MIRROR_DIR``).
"""
import tempfile
import tomllib

import matplotlib.pyplot as plt

from stimsim.paradigms import parse_experiment, run_experiment
from stimsim.utilities.errors import DataError

EXPERIMENT = """
name = "afraz2006_small"
paradigm = "categorization"
model = "stimsim-mnv2-s0"
layer = "IT"
seed = 0

[stimuli]
sets = [{ source = "floc", categories = ["adult", "child", "body", "house", "car"], heldout_only = true }]
label = "domain"
positive = "face"
negative = "nonface"
n_per_choice = 30

[stimuli.noise]
signal_percent = [0, 25, 50, 100]

[sites]
method = "selectivity"
n_selective = 4
n_other = 4

[stimulation]
kind = "electrical"
current_uA = 50
frequency_Hz = 200
pulse_width_ms = 0.2
train_ms = 50

[analysis]
n_boot = 100
n_perm = 100
"""

spec = parse_experiment(tomllib.loads(EXPERIMENT), where="afraz2006_small")
out = tempfile.mkdtemp()
try:
    summary = run_experiment(spec, out, progress=False)
    for key in ("control_accuracy", "model_r", "model_mean_shift_selective",
                "model_mean_shift_other"):   # shifts in % signal
        print(f"{key:28s} {summary[key]:.3g}")
except DataError as exc:  # the fLoc images come from the data mirror
    summary = None
    print(f"not run on this machine: {exc}")

# %%
# The run wrote ``results.nc``, ``summary.json``, ``config.json`` and figures into ``out``; here is
# its psychometric figure: stimulating a face-selective site moves the curve towards "face".
if summary is not None:
    plt.imshow(plt.imread(f"{out}/psychometric.png"))
    plt.axis("off")
    plt.show()

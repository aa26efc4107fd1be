"""
Run an experiment
=================

An experiment is a TOML file (``experiments/afraz2006.toml`` is the full Afraz et al. 2006
reproduction). Here a small version of it runs on the shipped model ``stimsim-topo-s0``: face /
non-face categorisation of noisy images, 50 µA at three face-selective and three other IT sites.
"""
import tempfile
import tomllib

import matplotlib.pyplot as plt

from stimsim.paradigms import parse_experiment, run_experiment

EXPERIMENT = """
name = "afraz2006_small"
paradigm = "categorization"
model = "stimsim-topo-s0"
layer = "IT"
seed = 0

[stimuli]
sets = [{ source = "lfw_subset", heldout_only = true }]
label = "category"
positive = "face"
n_per_choice = 20

[stimuli.noise]
signal_percent = [0, 25, 50, 100]

[sites]
method = "selectivity"
n_selective = 3
n_other = 3

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
summary = run_experiment(spec, out, progress=False)
for key in ("control_accuracy", "model_r", "model_mean_shift_selective",
            "model_mean_shift_other"):   # shifts in % signal
    print(f"{key:28s} {summary[key]:.3g}")

# %%
# The run wrote ``results.nc``, ``summary.json``, ``config.json`` and figures into ``out``; here is
# its psychometric figure: stimulating a face-selective site moves the curve towards "face".
plt.imshow(plt.imread(f"{out}/psychometric.png"))
plt.axis("off")
plt.show()

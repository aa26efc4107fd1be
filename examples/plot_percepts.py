"""
Predicted percepts of face-patch stimulation
============================================

``stimsim visualize`` synthesises, for each image, the image whose unstimulated IT activity best
matches IT under stimulation (:mod:`stimsim.percepts`). Here ``experiments/visualize_default.toml``
runs at a small size: ``stimsim-topo-s0`` is stimulated and inverted, and
``stimsim-topo-s1``'s face decoder is the independent judge. Rows: fLoc objects and places and a
face-like object of Moeller et al. 2017; columns: the original, the inversion without stimulation,
the face site at 50, 150 and 300 µA, a low-selectivity control site and the scrambled stimulation.
The images come from the published data mirror (``STIMSIM_MIRROR_DIR``).
"""
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

import stimsim
from stimsim.percepts.visualize import run_visualize
from stimsim.utilities.errors import DataError

default = Path(stimsim.__file__).resolve().parents[1] / "experiments" / "visualize_default.toml"
small = default.read_text()
for old, new in {"n = 2": "n = 1", "n_per_category = 16": "n_per_category = 8",
                 "steps = 100": "steps = 40", "jitter_px = 4": "jitter_px = 1"}.items():
    small = small.replace(old, new)
work = Path(tempfile.mkdtemp())
(work / "visualize.toml").write_text(small)
try:
    summary = run_visualize(work / "visualize.toml", work / "out", progress=False)
    print(json.dumps(summary["judges"], indent=1))
except DataError as exc:  # the fLoc and Moeller images come from the data mirror
    summary = None
    print(f"not run on this machine: {exc}")

# %%
# P(face) under every picture: the model's own face decoder / the independent judge.
if summary is not None:
    plt.figure(figsize=(9, 8))
    plt.imshow(plt.imread(work / "out" / "percepts.png"))
    plt.axis("off")

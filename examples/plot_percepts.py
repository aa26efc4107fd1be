"""
Predicted percepts of face-patch stimulation
============================================

``stimsim visualize`` synthesises, for each image, the image whose unstimulated IT activity best
matches IT under stimulation (:mod:`stimsim.percepts`). Here ``experiments/visualize_default.toml``
runs on one of its images (an fLoc car): ``stimsim-mnv2-s0`` is
stimulated and inverted, and ``stimsim-effl0-s0``'s face decoder (another architecture) is the independent
judge. Columns: the original, the inversion without stimulation, the face site at 100, 300 and
1000 µA, a low-selectivity control site and the scrambled stimulation. The images come from the
published data mirror (``STIMSIM_MIRROR_DIR``); the two ImageNet trunks from the data cache.
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
small = small.replace('categories = ["car", "instrument"]', 'categories = ["car"]')
small = small.replace("n_per_category = 3", "n_per_category = 1")
small = small.replace('summary_groups = ["object", "place"]', 'summary_groups = ["object"]')
small = small[:small.index('[[images]]\ngroup = "place"')] + small[small.index("[localizer]"):]
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
    plt.figure(figsize=(10, 2.2))
    plt.imshow(plt.imread(work / "out" / "percepts.png"))
    plt.axis("off")

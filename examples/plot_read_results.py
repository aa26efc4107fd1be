"""
Read results with xarray
========================

``results.nc`` is an xarray Dataset: choice probabilities per condition × stimulus × choice, with
every stimulation parameter as a coordinate, and per-site metrics on the ``site`` dimension. The run here is
on ``stimsim-topo-s0``, the small 32-px model that ships beside the ImageNet-based defaults, so that it takes
seconds.
"""
import tempfile
import tomllib

import matplotlib.pyplot as plt

from stimsim.paradigms import load_results, parse_experiment, run_experiment

EXPERIMENT = """
name = "muscimol_grid"
paradigm = "categorization"
model = "stimsim-topo-s0"
seed = 1

[stimuli]
sets = [{ source = "lfw_subset", heldout_only = true }]
label = "category"
positive = "face"
n_per_choice = 15

[sites]
method = "grid"
grid_step_mm = 3.0
margin_mm = 1.0

[stimulation]
kind = "muscimol"
volume_uL = 1.0

[analysis]
n_boot = 50
n_perm = 50
"""

out = tempfile.mkdtemp()
run_experiment(parse_experiment(tomllib.loads(EXPERIMENT)), out, progress=False, figures=False)
results, summary, config = load_results(out)
print(results)

# %%
# The stimulation parameters are coordinates of the ``condition`` dimension (the overview above
# shows only some of them):
print([name for name, coord in results.coords.items() if coord.dims == ("condition",)])
print(results["choice_probability"].sel(condition="site_001").to_pandas().head(3))

# %%
# Select by label: the probability of "face" for every site's condition, averaged over images,
# against the site's distance from the peak of the face-selectivity map.
p_face = results["choice_probability"].sel(choice="face").mean("stimulus_id")
control = float(p_face.sel(condition="control"))
effect = p_face.sel(condition=results["site"].values).values - control
plt.scatter(results["distance_to_peak_mm"].values, effect)
plt.axhline(0, color="grey", lw=0.5)
plt.xlabel("distance from the face patch (mm)")
plt.ylabel("Δ P(face), muscimol − control")
plt.show()

"""
Analyse a lab's session
=======================

``stimsim analyze`` reads the trials a rig recorded and measures every site's effect
(ΔAUC: the area under P("high") against the step of the image sequence, stimulated minus
sham). Here a session with a planted truth — six sites without an effect, six that push
choices towards "high" — is written the way a lab's rig might write it: its own column
names, choices coded 0/1 and sham trials as stimulation channel −1. A column mapping and
a value mapping (``--columns`` and ``--values`` on the command line) translate it.
"""
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from scipy.integrate import trapezoid

from stimsim.analysis.analyze import analyze
from stimsim.analysis.synthetic import planted_curves, planted_session
from stimsim.lab.sessions import load_sessions, value_mapping

stim_logodds = [0.0] * 6 + [1.5] * 6     # planted effect of each site (log-odds)
trials = planted_session(stim_logodds, trials_per_site=400, lapse_rate=0.02, seed=0)

# The rig's own names and codes.
lab = trials.rename(columns={
    "electrode": "site", "step": "morph_level", "stimulated_electrode": "stim_channel",
    "current_uA": "amplitude_uA", "choice": "response"})
lab["response"] = lab["response"].map({"low": 0, "high": 1})
lab["stim_channel"] = lab["stim_channel"].replace("sham", "-1")
path = Path(tempfile.mkdtemp()) / "rig_session.csv"
lab.to_csv(path, index=False)

# stimsim analyze rig_session.csv --columns site=electrode,... \
#     --values choice:0=low,1=high --values stimulated_electrode:-1=sham --out DIR
columns = {"site": "electrode", "morph_level": "step",
           "stim_channel": "stimulated_electrode", "amplitude_uA": "current_uA",
           "response": "choice"}
values = value_mapping(["choice:0=low,1=high", "stimulated_electrode:-1=sham"])
sessions = load_sessions(path, columns=columns, values=values)
analysis = analyze(sessions, n_boot=200, n_perm=200)

# %%
# Many sites, many tests: the uncorrected count of significant sites beside the false
# positives expected when no site has an effect, and the Benjamini–Hochberg count
# (``p_fdr`` per site) beside its own chance level.
summary = analysis.summary
for key in ("n_sites", "n_sites_significant", "n_sites_significant_chance",
            "n_sites_significant_fdr", "n_sites_significant_fdr_chance",
            "mean_shift", "wilcoxon_p"):
    print(f"{key:32s} {summary[key]:.3g}")
print(analysis.sites[["electrode", "delta_auc", "permutation_p", "p_fdr"]]
      .to_string(index=False))

# %%
# Observed ΔAUC with its bootstrap interval against the planted one.
curves = planted_curves(stim_logodds, lapse_rate=0.02)
x = np.linspace(0.0, 1.0, curves.shape[-1])
true_delta_auc = trapezoid(curves[:, 1] - curves[:, 0], x, axis=-1)
sites = analysis.sites
error = [sites["delta_auc"] - sites["delta_auc_low"],
         sites["delta_auc_high"] - sites["delta_auc"]]
fig, ax = plt.subplots(figsize=(4.5, 4))
ax.errorbar(true_delta_auc, sites["delta_auc"], yerr=error, fmt="o", capsize=3)
ax.axline((0, 0), slope=1, color="gray", lw=0.8, ls="--")
ax.set_xlabel("planted ΔAUC")
ax.set_ylabel("observed ΔAUC (95 % bootstrap interval)")
fig.tight_layout()
plt.show()

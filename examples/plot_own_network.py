"""
Bring your own network
======================

Any network ``torch.fx`` can trace works: stimsim splits it at the stimulated layer (named as
``print(model)`` names its modules) and runs only the later layers on the perturbed activity. This
one pools with a functional call and has a skip connection in its forward. Its ``it`` layer gets
retinotopic positions on a 6 mm sheet.
"""
import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from stimsim.behavior import LogisticDecoder
from stimsim.cortex.positions import retinotopic_positions
from stimsim.cortex.sheet import CorticalSheet
from stimsim.data.stimuli import lfw_subset
from stimsim.engine import simulate
from stimsim.models.preprocessing import Preprocessing
from stimsim.models.topographic import TopographicModel
from stimsim.stimulation import Condition, ElectricalStimulation


class LabNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.it = nn.Sequential(nn.Linear(16, 256), nn.ReLU())
        self.head = nn.Linear(256, 2)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.head(self.it(x))


torch.manual_seed(0)
network = LabNet()
sheet = CorticalSheet("it", (256, 1, 1), retinotopic_positions((256, 1, 1), 6.0, seed=0))
model = TopographicModel(network, {"it": sheet}, Preprocessing(size_px=25, channels=1, mean=(0.5,), std=(0.25,)),
                         {"family": "lab_net", "kwargs": {}}, areas={"it": "IT"}, name="lab_net")
print(model.stage_names)

# %%
# A frozen face / non-face decoder on IT, then 100 µA at every point of a grid on the sheet.
faces = lfw_subset()
decoder = LogisticDecoder.fit(model.activations(faces.images, "IT"), faces.labels["category"], layer="it", C=0.1)
grid = [(x, y) for y in np.linspace(1, 5, 5) for x in np.linspace(1, 5, 5)]
conditions = [Condition("control")] + [
    Condition(f"site {i}", (ElectricalStimulation(sites_mm=(site,), current_uA=100, frequency_Hz=200,
                                                  pulse_width_ms=0.2, train_ms=50, layer="IT"),))
    for i, site in enumerate(grid)]
p = simulate(model, faces.images, conditions, decoder, progress=False)
p_face = p.sel(choice="face").mean("stimulus_id")
change = (p_face[1:] - p_face.sel(condition="control")).values.reshape(5, 5)

plt.imshow(change, origin="lower", extent=(0.5, 5.5, 0.5, 5.5), cmap="RdBu_r",
           vmin=-abs(change).max(), vmax=abs(change).max())
plt.colorbar(label="Δ P(face)")
plt.xlabel("x (mm)")
plt.ylabel("y (mm)")
plt.title("100 µA at each site of an untrained network")
plt.show()

"""The figure of predicted percepts (``percepts.png``): one row per image, the original and its percept under every
condition, each with P(face) under the model's own face decoder and under the independent judge."""
from __future__ import annotations

import textwrap

import xarray as xr

from stimsim.utilities.figures import pyplot, save_figure


#: Images the figure shows at most (a taller figure passes the image size a PNG renderer can draw); every image's
#: percepts are in ``percepts.nc``.
MAX_FIGURE_ROWS = 40


def shown_rows(groups, limit: int = MAX_FIGURE_ROWS) -> list[int]:
    """Indices of the rows the figure shows, in their order: every row when there are at most ``limit``, else
    ``limit`` rows taken in turn from each group (its first image, then its second, ...), so every group is seen."""
    groups = [str(group) for group in groups]
    if len(groups) <= limit:
        return list(range(len(groups)))
    rank = [groups[:index].count(group) for index, group in enumerate(groups)]
    order = list(dict.fromkeys(groups))
    taken = sorted(range(len(groups)), key=lambda index: (rank[index], order.index(groups[index])))[:limit]
    return sorted(taken)


def plot_percepts(dataset: xr.Dataset, path, title: str, notes=()) -> None:
    """The grid: one row per image (at most :data:`MAX_FIGURE_ROWS`, shared among the groups, the figure saying
    how many it leaves out), columns original then every condition, P(face) (own / independent) below; ``notes``
    (what limits the results) under it."""
    plt = pyplot()
    n_images = dataset.sizes["stimulus_id"]
    rows = shown_rows(dataset["group"].values)
    if len(rows) < n_images:
        dataset = dataset.isel(stimulus_id=rows)
        notes = [*notes, f"the figure shows {len(rows)} of the {n_images} images, shared among the groups; every "
                         "image's percepts are in percepts.nc"]
    n_rows, n_cols = dataset.sizes["stimulus_id"], dataset.sizes["condition"] + 1
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(1.6 * n_cols, 1.75 * n_rows + 0.6), squeeze=False,
                             layout="constrained")  # room for every label whatever the number of rows
    gray = dataset.sizes["channel"] == 1
    for row in range(n_rows):
        pictures = [dataset["original"].values[row]] + list(dataset["percept"].values[row])
        scores = [dataset["p_face_original"].values[:, row]] + list(dataset["p_face"].values[:, row].T)
        for col, (picture, score) in enumerate(zip(pictures, scores)):
            ax = axes[row, col]
            ax.imshow(picture[..., 0] if gray else picture, cmap="gray" if gray else None, vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_xlabel(f"P(face) {score[0]:.2f} / {score[1]:.2f}", fontsize=6)
            if row == 0:
                label = str(dataset["condition"].values[col - 1]) if col else "original"
                heading = label.replace("_", " ").replace("uA", " µA")
                ax.set_title(heading, fontsize=7)
        axes[row, 0].set_ylabel(f"{dataset['group'].values[row]}\n{short_image_id(dataset['stimulus_id'].values[row])}",
                                fontsize=7)
    width = int(18 * n_cols)  # characters a line of small text holds across the figure
    fig.suptitle("\n".join(textwrap.wrap(title, width) + ["P(face): own decoder / independent judge"]), fontsize=8)
    if notes:
        lines = [line for note in notes for line in textwrap.wrap(f"Note: {note}", width)]
        fig.supxlabel("\n".join(lines), fontsize=7, color="C3")
    save_figure(fig, path)


def short_image_id(stimulus_id: str, line: int = 18) -> str:
    """An image id short enough to label a row of thumbnails: its last path part, at most two lines of ``line``
    characters, the middle left out (…) when longer; the full ids are in ``percepts.nc``."""
    name = str(stimulus_id).rsplit("/", 1)[-1]
    if len(name) > 2 * line:
        name = name[:line] + "…" + name[-(line - 1):]
    return name if len(name) <= line else f"{name[:line]}\n{name[line:]}"

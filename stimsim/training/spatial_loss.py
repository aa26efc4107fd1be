"""TDANN's relative spatial loss (Margalit et al. 2024, Neuron, STAR Methods).

For a neighbourhood of units: r_ij = Pearson correlation of units i and j over the batch,
s_ij = 1 / (d_ij + 1) with d_ij their cortical distance in mm, and

    SL = (1 − corr(lowertri(r), lowertri(s))) / 2,

so SL = 0 when response similarity falls with distance exactly as 1/(d + 1) does (up to an
affine map), 0.5 when unrelated. The layer's loss is the mean over sampled neighbourhoods.
"""
from __future__ import annotations

import torch

_EPS = 1e-8


def _pearson_columns(x: torch.Tensor) -> torch.Tensor:
    """Correlation matrix (Q, Q) of the columns of ``x`` (B, Q); constant columns correlate 0."""
    centred = x - x.mean(0, keepdim=True)
    scaled = centred / (centred.norm(dim=0, keepdim=True) + _EPS)
    return scaled.T @ scaled


def neighborhood_spatial_loss(responses: torch.Tensor, coordinates_mm: torch.Tensor) -> torch.Tensor:
    """Relative spatial loss of one neighbourhood: responses (B, Q), coordinates_mm (Q, 2)."""
    if responses.shape[0] < 2:
        raise ValueError("the spatial loss needs a batch of at least 2 images")
    response_corr = _pearson_columns(responses)
    inverse_distance = 1.0 / (torch.cdist(coordinates_mm, coordinates_mm) + 1.0)
    rows, cols = torch.tril_indices(len(coordinates_mm), len(coordinates_mm), offset=-1)
    pair_r = response_corr[rows, cols]
    pair_s = inverse_distance[rows, cols].to(pair_r.dtype)
    agreement = _pearson_columns(torch.stack([pair_r, pair_s], dim=1))[0, 1]
    return (1.0 - agreement) / 2.0


def layer_spatial_loss(responses: torch.Tensor, coordinates_mm: torch.Tensor,
                       neighborhoods: torch.Tensor) -> torch.Tensor:
    """Mean relative spatial loss over ``neighborhoods`` (P, Q) of unit indices.

    responses : (B, N) activations of the layer flattened C-major; coordinates_mm : (N, 2).
    """
    losses = [neighborhood_spatial_loss(responses[:, idx], coordinates_mm[idx]) for idx in neighborhoods]
    return torch.stack(losses).mean()

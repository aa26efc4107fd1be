"""Swap optimisation of unit positions: TDANN's pre-optimisation of a retinotopic layout.

Margalit et al. 2024 (Neuron), "A unifying framework for functional organization in early and
higher ventral visual cortex": before training, the retinotopically initialised positions were
rearranged by swapping the positions of unit pairs whenever that lowered the spatial loss on a
pretrained network's responses. The set of positions never changes, only which unit sits where.

Here the loss is the mean relative spatial loss (``stimsim.training.spatial_loss``) over the sheet's
neighbourhoods, read as fixed sets of *positions* (slots): since swaps only permute units over the
slots, every neighbourhood keeps its place on the sheet. Each step picks one neighbourhood, scores
all swaps of ``candidates_per_step`` of its units with every other unit of it in closed form
(only the neighbourhood's sum of r_ij·s_ij changes under a swap inside it), then checks the best
``swaps_per_step`` proposals exactly against the loss of *every* neighbourhood they touch and keeps
those that lower the mean loss. The loss therefore never rises from one step to the next.
"""
from __future__ import annotations

import numpy as np
import torch

from stimsim.cortex.sheet import CorticalSheet

#: Added to norms as in ``stimsim.training.spatial_loss`` (constant units then correlate 0).
_EPS = 1e-8
#: A swap is kept only when it lowers the mean loss by more than this (guards against round-off).
_MIN_IMPROVEMENT = 1e-12


def swap_optimize(sheet: CorticalSheet, responses, n_steps: int, seed: int = 0, candidates_per_step: int = 32,
                  swaps_per_step: int = 4) -> tuple[CorticalSheet, np.ndarray]:
    """Rearrange the units of ``sheet`` over its positions to lower the spatial loss of ``responses``.

    Parameters
    ----------
    sheet : a sheet with precomputed neighbourhoods (``sheet.with_neighborhoods(...)`` or
        ``positions.build_sheet``); units outside every neighbourhood never move.
    responses : (B, N) activations of the layer for B >= 2 images (tensor or array), N = sheet.n_units,
        flattened C-major like the sheet's coordinates.
    n_steps : number of steps (one neighbourhood each), >= 0.
    seed : seed of the random choices; the result is deterministic given it.
    candidates_per_step : units of the chosen neighbourhood whose swaps with every other unit of it
        are scored per step, >= 1.
    swaps_per_step : best-scoring proposals checked exactly (and kept if they lower the loss) per step, >= 1.

    Returns
    -------
    new_sheet : CorticalSheet
        The sheet with the same name, dims and set of positions (coordinates_mm permuted over units;
        neighbourhoods renumbered to the units now at their positions).
    history : numpy.ndarray
        The mean spatial loss over the neighbourhoods before the first step and after each step
        (length n_steps + 1, non-increasing).
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 0:
        raise ValueError(f"n_steps must be an integer >= 0, got {n_steps!r}")
    for label, value in (("candidates_per_step", candidates_per_step), ("swaps_per_step", swaps_per_step)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
    values = _as_response_array(responses, sheet)
    if sheet.neighborhood_indices.size == 0 or sheet.neighborhood_indices.shape[1] < 2:
        raise ValueError(
            f"sheet {sheet.name!r} has no neighbourhoods of >= 2 units; add them with "
            "sheet.with_neighborhoods(width_mm, n_neighborhoods) before swap optimisation"
        )
    if np.any(np.diff(np.sort(sheet.neighborhood_indices, axis=1), axis=1) == 0):
        raise ValueError(f"sheet {sheet.name!r}: a neighbourhood lists the same unit twice; each row of "
                         "neighborhood_indices must hold distinct unit indices")
    state = _SwapState(values, sheet.coordinates_mm, sheet.neighborhood_indices)
    rng = np.random.default_rng(seed)
    history = [state.mean_loss()]
    for _ in range(n_steps):
        neighborhood = int(rng.integers(len(state.neighborhoods)))
        for slot_a, slot_b in state.propose(neighborhood, candidates_per_step, swaps_per_step, rng):
            state.try_swap(slot_a, slot_b)
        history.append(state.mean_loss())
    coordinates_mm = np.empty_like(sheet.coordinates_mm)
    coordinates_mm[state.unit_at_slot] = sheet.coordinates_mm
    new_sheet = CorticalSheet(sheet.name, sheet.dims, coordinates_mm, state.unit_at_slot[sheet.neighborhood_indices],
                              sheet.neighborhood_width_mm)
    return new_sheet, np.asarray(history)


def _as_response_array(responses, sheet: CorticalSheet) -> np.ndarray:
    if isinstance(responses, torch.Tensor):
        responses = responses.detach().cpu().numpy()
    values = np.asarray(responses, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] != sheet.n_units or values.shape[0] < 2:
        raise ValueError(
            f"responses must be (B, N) with B >= 2 images and N = {sheet.n_units} units of sheet "
            f"{sheet.name!r}, got shape {values.shape}"
        )
    if not np.all(np.isfinite(values)):
        raise ValueError("responses contain NaN or infinite values")
    return values


class _SwapState:
    """Unit ↔ slot assignment and, per neighbourhood, the sums that give its spatial loss.

    For the n = Q(Q-1)/2 unit pairs of a neighbourhood: Σr, Σr², Σr·s change with swaps,
    Σs, Σs² are fixed (they depend on the slots only). Pearson correlation from sums:
    corr = (Σrs − ΣrΣs/n) / sqrt((Σr² − (Σr)²/n)(Σs² − (Σs)²/n)).
    """

    def __init__(self, responses: np.ndarray, slots_mm: np.ndarray, neighborhoods: np.ndarray):
        centred = responses - responses.mean(0, keepdims=True)
        self.z = centred / (np.linalg.norm(centred, axis=0, keepdims=True) + _EPS)
        self.slots_mm = slots_mm
        self.neighborhoods = neighborhoods
        self.unit_at_slot = np.arange(len(slots_mm))
        n_neighborhoods, size = neighborhoods.shape
        self.n_pairs = size * (size - 1) / 2
        self.sums = np.empty((n_neighborhoods, 3))  # Σr, Σr², Σrs
        self.sum_s = np.empty(n_neighborhoods)
        self.sum_s2 = np.empty(n_neighborhoods)
        for p, slots in enumerate(neighborhoods):
            corr = self._correlations(slots)
            similarity = self._inverse_distance(slots)
            self.sums[p] = (_pair_sum(corr), _pair_sum(corr * corr), _pair_sum(corr * similarity))
            self.sum_s[p] = _pair_sum(similarity)
            self.sum_s2[p] = _pair_sum(similarity * similarity)
        self.losses = self._losses(np.arange(n_neighborhoods), self.sums)
        flat = neighborhoods.ravel()
        order = np.argsort(flat, kind="stable")
        self._member_of = order // size
        self._member_start = np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=len(slots_mm)))])

    def mean_loss(self) -> float:
        return float(self.losses.mean())

    def _correlations(self, slots: np.ndarray) -> np.ndarray:
        z = self.z[:, self.unit_at_slot[slots]]
        return z.T @ z

    def _inverse_distance(self, slots: np.ndarray) -> np.ndarray:
        xy = self.slots_mm[slots]
        return 1.0 / (np.linalg.norm(xy[:, None, :] - xy[None, :, :], axis=-1) + 1.0)

    def _losses(self, index: np.ndarray, sums: np.ndarray) -> np.ndarray:
        n = self.n_pairs
        sum_r, sum_r2, sum_rs = sums.T
        sum_s, sum_s2 = self.sum_s[index], self.sum_s2[index]
        covariance = sum_rs - sum_r * sum_s / n
        variance = np.clip(sum_r2 - sum_r ** 2 / n, 0.0, None) * np.clip(sum_s2 - sum_s ** 2 / n, 0.0, None)
        scale = np.sqrt(variance)
        agreement = np.divide(covariance, scale, out=np.zeros_like(covariance), where=scale > _EPS)
        return (1.0 - agreement) / 2.0

    def propose(self, neighborhood: int, n_candidates: int, n_swaps: int, rng) -> list[tuple[int, int]]:
        """Best swaps (slot pairs) inside one neighbourhood by their gain in its Σr·s.

        A swap of slots a and b inside the neighbourhood permutes its pair correlations, so Σr and
        Σr² stay put and only Σr·s changes, by Σ_{j≠a,b} (C_bj − C_aj)(S_aj − S_bj) with C the
        correlations of the current occupants and S = 1/(d+1) of the slots. With M = C·S and
        d_x = Σ_j C_xj S_xj this is M_ab + M_ba − d_a − d_b minus the j = a and j = b terms.
        """
        slots = self.neighborhoods[neighborhood]
        corr = self._correlations(slots)
        similarity = self._inverse_distance(slots)
        size = len(slots)
        rows = rng.choice(size, size=min(n_candidates, size), replace=False)
        corr_rows, sim_rows = corr[rows], similarity[rows]
        corr_diag, sim_diag = np.diag(corr), np.diag(similarity)
        own = (corr * similarity).sum(1)
        gain = corr_rows @ similarity + (corr @ similarity[:, rows]).T - own[rows, None] - own[None, :]
        gain -= (corr_rows - corr_diag[rows, None]) * (sim_diag[rows, None] - sim_rows)
        gain -= (corr_diag[None, :] - corr_rows) * (sim_rows - sim_diag[None, :])
        gain[np.arange(len(rows)), rows] = -np.inf
        proposals, seen = [], set()
        for flat in np.argsort(-gain, axis=None, kind="stable"):
            i, j = divmod(int(flat), size)
            if gain[i, j] <= 0 or len(proposals) == n_swaps:
                break
            pair = (min(rows[i], j), max(rows[i], j))
            if pair not in seen:
                seen.add(pair)
                proposals.append((int(slots[pair[0]]), int(slots[pair[1]])))
        return proposals

    def _neighborhoods_of(self, slot: int) -> np.ndarray:
        return self._member_of[self._member_start[slot]:self._member_start[slot + 1]]

    def try_swap(self, slot_a: int, slot_b: int) -> None:
        """Swap the units at two slots if that lowers the mean loss over all neighbourhoods (exact)."""
        index = np.union1d(self._neighborhoods_of(slot_a), self._neighborhoods_of(slot_b))
        members = self.neighborhoods[index]
        unit_a, unit_b = self.unit_at_slot[slot_a], self.unit_at_slot[slot_b]
        occupants = self.z[:, self.unit_at_slot[members].ravel()]
        corr_a, corr_b = (self.z[:, [unit_a, unit_b]].T @ occupants).reshape(2, *members.shape)
        at_a, at_b = members == slot_a, members == slot_b
        has_a, has_b = at_a.any(1).astype(float), at_b.any(1).astype(float)
        others = ~(at_a | at_b)
        change = (corr_b - corr_a) * others
        sim_a = 1.0 / (np.linalg.norm(self.slots_mm[members] - self.slots_mm[slot_a], axis=-1) + 1.0)
        sim_b = 1.0 / (np.linalg.norm(self.slots_mm[members] - self.slots_mm[slot_b], axis=-1) + 1.0)
        sign = has_a - has_b
        delta = np.stack([
            sign * change.sum(1),
            sign * ((corr_b ** 2 - corr_a ** 2) * others).sum(1),
            (change * (has_a[:, None] * sim_a - has_b[:, None] * sim_b)).sum(1),
        ], axis=1)
        new_sums = self.sums[index] + delta
        new_losses = self._losses(index, new_sums)
        if (new_losses - self.losses[index]).sum() / len(self.losses) >= -_MIN_IMPROVEMENT:
            return
        self.unit_at_slot[slot_a], self.unit_at_slot[slot_b] = unit_b, unit_a
        self.sums[index] = new_sums
        self.losses[index] = new_losses


def _pair_sum(matrix: np.ndarray) -> float:
    """Sum over the unordered pairs i < j of a symmetric matrix."""
    return float((matrix.sum() - np.trace(matrix)) / 2.0)

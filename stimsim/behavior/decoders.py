"""Frozen behavioural decoders: model activity -> choice probabilities.

A decoder is fitted once on the features of *unperturbed* images and then frozen, as the animal
learned its task before it was ever stimulated. The simulation engine calls
every decoder through :class:`Decoder`::

    probabilities(features (K, B, F), stimulus_index (B,) or None) -> (K, B, n_choices)

where K counts conditions (stimulation sites, currents, sham, ...), B the stimuli and F the
flattened activations of the readout layer. A frozen decoder is plain numbers: ``to_dict`` gives
lists that JSON can store beside a result, and :func:`decoder_from_dict` rebuilds it.

The readout is a multinomial logistic regression on standardised features, as in Brain-Score's
behavioural benchmarks (regularisation C = 1e-3; Schrimpf et al. 2024, bioRxiv
2024.01.09.572970). It is fitted with scikit-learn (lbfgs) and applied in torch, in float64, so the
probabilities equal scikit-learn's ``predict_proba`` on the same features.

Over 500 lines: the frozen decoders share their checks and their round trip through plain numbers (``to_dict``
/ :func:`decoder_from_dict`), which must stay in step.
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from stimsim.utilities.errors import ConfigError

#: Rows of a (rows, F) float64 block handled at once are limited to about this many numbers
#: (64 MiB), so large (K, B, F) batches never need a full float64 copy.
_CHUNK_NUMBERS = 1 << 23

#: The two choices of a same/different task, in the order of the probability axis.
SAME_DIFFERENT_CHOICES = ("same", "different")


def _as_numpy_2d(name: str, values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array (n_samples, n_features), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values; only finite features can be fitted")
    return array


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def _check_max_iter(max_iter: int) -> int:
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
    return int(max_iter)


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=np.float64, copy=True)
    array.setflags(write=False)
    return array


def _check_keys(data: dict, kind: str, required: set[str]) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"a stored decoder must be a dict, got {type(data).__name__}")
    if data.get("kind") != kind:
        raise ConfigError(f"stored decoder has kind {data.get('kind')!r}, expected {kind!r}")
    keys = set(data) - {"kind"}
    missing, unknown = required - keys, keys - required
    if missing or unknown:
        raise ConfigError(
            f"stored {kind} decoder: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}; "
            f"expected exactly {sorted(required | {'kind'})}"
        )


@dataclass(frozen=True, eq=False)
class LinearReadout:
    """Softmax readout on standardised features, frozen as float64 numbers.

    ``logits = ((x - feature_mean) / feature_scale) @ coef.T + intercept``, probabilities = softmax.
    A two-choice readout stores row 0 of ``coef`` and ``intercept`` as zeros, so the softmax equals
    scikit-learn's binary ``predict_proba`` (1 - sigmoid(z), sigmoid(z)).

    Parameters
    ----------
    choices : labels of the probability axis.
    feature_mean, feature_scale : (F,) standardisation (mean 0, scale 1 when not standardised).
    coef : (n_choices, F) weights on the standardised features; intercept : (n_choices,).
    fit_params : how it was fitted (C, standardize, max_iter, seed, n_samples, n_iter, converged).
    """

    choices: tuple[str, ...]
    feature_mean: np.ndarray
    feature_scale: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    fit_params: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "choices", tuple(str(choice) for choice in self.choices))
        n_choices = len(self.choices)
        if n_choices < 2 or len(set(self.choices)) != n_choices:
            raise ConfigError(f"a readout needs at least 2 distinct choices, got {self.choices!r}")
        for name in ("feature_mean", "feature_scale", "coef", "intercept"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        n_features = self.feature_mean.shape[0] if self.feature_mean.ndim == 1 else -1
        expected = {
            "feature_mean": (n_features,),
            "feature_scale": (n_features,),
            "coef": (n_choices, n_features),
            "intercept": (n_choices,),
        }
        for name, shape in expected.items():
            array = getattr(self, name)
            if n_features < 1 or array.shape != shape:
                raise ConfigError(
                    f"readout {name} has shape {array.shape}; with {n_choices} choices and "
                    f"feature_mean of shape {self.feature_mean.shape} it must be {shape}"
                )
            if not np.all(np.isfinite(array)):
                raise ConfigError(f"readout {name} contains NaN or infinite values")
        if np.any(self.feature_scale <= 0):
            raise ConfigError("readout feature_scale must be > 0 for every feature")
        # Standardisation folded into the weights: logits = x @ weight.T + bias.
        weight = self.coef / self.feature_scale
        object.__setattr__(self, "_weight", torch.from_numpy(weight))
        object.__setattr__(self, "_bias", torch.from_numpy(self.intercept - weight @ self.feature_mean))

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_on_device", None)  # per-device copies of the weights are rebuilt where needed
        return state

    @property
    def n_features(self) -> int:
        return int(self.feature_mean.shape[0])

    def probabilities_torch(self, features: torch.Tensor) -> torch.Tensor:
        """(..., F) tensor -> (..., n_choices) probabilities, computed in float64 on the
        features' device and returned as float32 (float64 for float64 features)."""
        if features.shape[-1] != self.n_features:
            raise ValueError(
                f"features have {features.shape[-1]} values per stimulus, the decoder was fitted on "
                f"{self.n_features}"
            )
        out_dtype = torch.promote_types(features.dtype, torch.float32)
        rows = features.reshape(-1, self.n_features)
        weight, bias = self.weights_on(features.device)
        compute = weight.dtype
        chunk_rows = max(1, _CHUNK_NUMBERS // self.n_features)
        blocks = [
            torch.softmax(rows[start:start + chunk_rows].to(compute) @ weight.T + bias, dim=-1).to(out_dtype)
            for start in range(0, rows.shape[0], chunk_rows)
        ]
        probabilities = torch.cat(blocks) if blocks else rows.new_zeros((0, len(self.choices)), dtype=out_dtype)
        return probabilities.reshape(*features.shape[:-1], len(self.choices))

    def predict_proba(self, features) -> np.ndarray:
        """(N, F) numpy/torch features -> (N, n_choices) float64 probabilities."""
        array = _as_numpy_2d("features", features)
        return self.probabilities_torch(torch.from_numpy(array)).numpy()

    def weights_on(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight (n_choices, F), bias (n_choices,)) with the standardisation folded in, such that
        ``logits = features @ weight.T + bias``; float64 (float32 on Apple MPS, which has no float64), kept on
        ``device`` after the first call."""
        device = torch.device(device)
        cache = self.__dict__.setdefault("_on_device", {})
        if device not in cache:
            dtype = torch.float32 if device.type == "mps" else torch.float64
            cache[device] = (self._weight.to(device=device, dtype=dtype), self._bias.to(device=device, dtype=dtype))
        return cache[device]

    def to_dict(self) -> dict:
        return {
            "choices": list(self.choices),
            "feature_mean": self.feature_mean.tolist(),
            "feature_scale": self.feature_scale.tolist(),
            "coef": self.coef.tolist(),
            "intercept": self.intercept.tolist(),
            "fit_params": dict(self.fit_params),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "LinearReadout":
        required = {"choices", "feature_mean", "feature_scale", "coef", "intercept", "fit_params"}
        if not isinstance(data, dict) or set(data) != required:
            found = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"stored readout must have exactly the keys {sorted(required)}, got {found}")
        try:
            arrays = {name: np.asarray(data[name], dtype=np.float64)
                      for name in ("feature_mean", "feature_scale", "coef", "intercept")}
        except (TypeError, ValueError) as error:
            raise ConfigError(f"stored readout has non-numeric or ragged arrays: {error}") from error
        return cls(choices=tuple(str(c) for c in data["choices"]), fit_params=dict(data["fit_params"]), **arrays)

    @classmethod
    def fit(cls, features: np.ndarray, codes: np.ndarray, choices: tuple[str, ...], *, C: float,
            standardize: bool, seed: int, max_iter: int) -> "LinearReadout":
        """Fit on (N, F) float64 features and integer class codes 0..n_choices-1."""
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        if not isinstance(standardize, bool):
            raise ValueError(f"standardize must be True or False, got {standardize!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        present = np.unique(codes)
        if present.size != len(choices):
            missing = [choices[i] for i in range(len(choices)) if i not in present]
            raise ValueError(f"every choice needs fitting samples; none for {missing}")
        if standardize:
            scaler = StandardScaler().fit(features)
            mean, scale = scaler.mean_, scaler.scale_
        else:
            mean, scale = np.zeros(features.shape[1]), np.ones(features.shape[1])
        # scikit-learn itself warns (ConvergenceWarning) when lbfgs stops at max_iter.
        model = LogisticRegression(C=C, solver="lbfgs", max_iter=max_iter, random_state=int(seed))
        model.fit((features - mean) / scale, codes)
        n_iter = int(np.max(model.n_iter_))
        coef, intercept = model.coef_, model.intercept_
        if len(choices) == 2:
            coef = np.vstack([np.zeros_like(coef), coef])
            intercept = np.concatenate([[0.0], intercept])
        fit_params = {
            "C": C, "standardize": standardize, "max_iter": max_iter, "seed": int(seed),
            "n_samples": int(features.shape[0]), "n_iter": n_iter, "converged": n_iter < max_iter,
        }
        return cls(choices=tuple(choices), feature_mean=mean, feature_scale=scale, coef=coef,
                   intercept=intercept, fit_params=fit_params)


class Decoder(abc.ABC):
    """A frozen readout of one model stage; what the simulation engine calls.

    Attributes
    ----------
    layer : model stage whose flattened activations are the features.
    choices : choice labels, the order of the probability axis.
    """

    layer: str
    choices: tuple[str, ...]

    @abc.abstractmethod
    def probabilities(self, features: torch.Tensor, stimulus_index: torch.Tensor | None = None) -> torch.Tensor:
        """(K, B, F) features -> (K, B, n_choices) choice probabilities (rows sum to 1).
        ``stimulus_index`` (B,) long says which stimulus each of the B columns is."""

    @abc.abstractmethod
    def to_dict(self) -> dict:
        """The frozen decoder as plain numbers and lists (JSON-compatible)."""

    @classmethod
    @abc.abstractmethod
    def from_dict(cls, data: dict) -> "Decoder":
        """Rebuild the decoder that :meth:`to_dict` stored."""


def _check_batch(features: torch.Tensor) -> None:
    if not isinstance(features, torch.Tensor):
        raise TypeError(f"features must be a torch.Tensor of shape (K, B, F), got {type(features).__name__}")
    if features.ndim != 3:
        raise ValueError(f"features must have shape (K conditions, B stimuli, F features), got {tuple(features.shape)}")


def _check_layer(layer) -> str:
    if not isinstance(layer, str) or not layer:
        raise ValueError(f"layer must be a non-empty stage name such as 'layer4.1', got {layer!r}")
    return layer


@dataclass(frozen=True, eq=False)
class LogisticDecoder(Decoder):
    """Multinomial logistic regression on standardised features of ``layer``.

    Example
    -------
    >>> import numpy as np, torch
    >>> x = np.array([[0.0], [0.2], [1.0], [1.2]]); y = ["nonface", "nonface", "face", "face"]
    >>> decoder = LogisticDecoder.fit(x, y, layer="layer4.1", C=1.0)
    >>> decoder.choices
    ('face', 'nonface')
    >>> decoder.probabilities(torch.tensor([[[1.1]]])).argmax(-1).item()
    0
    """

    layer: str
    readout: LinearReadout

    kind = "logistic"

    @property
    def choices(self) -> tuple[str, ...]:
        return self.readout.choices

    @classmethod
    def fit(cls, features, labels, layer: str, C: float = 1e-3, standardize: bool = True, seed: int = 0,
            max_iter: int = 1000) -> "LogisticDecoder":
        """Fit on unperturbed (N, F) features and (N,) labels (str or int; choices are their
        string forms, sorted as the labels sort). ``C`` is the inverse L2 regularisation strength."""
        layer = _check_layer(layer)
        array = _as_numpy_2d("features", features)
        labels = np.asarray(labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else labels)
        if labels.ndim != 1 or labels.shape[0] != array.shape[0]:
            raise ValueError(f"labels must have shape ({array.shape[0]},) to match features, got {labels.shape}")
        missing = np.flatnonzero([label is None or (isinstance(label, float) and math.isnan(label))
                                  for label in labels.tolist()])
        if missing.size:
            raise ValueError(f"labels must all be given (str or int): {missing.size} are missing (None or NaN), the "
                             f"first at position {missing[0]}")
        try:
            classes, codes = np.unique(labels, return_inverse=True)
        except TypeError as error:
            raise ValueError(f"labels must all be strings or all be integers: {error}") from error
        choices = tuple(str(c) for c in classes)
        if len(choices) < 2:
            raise ValueError(f"a decoder needs at least 2 different labels, got only {list(choices)}")
        if len(set(choices)) != len(choices):
            raise ValueError(f"labels {classes.tolist()} give duplicate choice names {list(choices)}")
        readout = LinearReadout.fit(
            array, codes, choices, C=_check_positive("C", C), standardize=standardize, seed=seed,
            max_iter=_check_max_iter(max_iter),
        )
        return cls(layer=layer, readout=readout)

    def probabilities(self, features: torch.Tensor, stimulus_index: torch.Tensor | None = None) -> torch.Tensor:
        """(K, B, F) -> (K, B, n_choices); ``stimulus_index`` is not needed and ignored. Computed on the
        features' device."""
        _check_batch(features)
        return self.readout.probabilities_torch(features)

    def linear_weights(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder is linear in its features up to the softmax: ``logits = features @ weight.T + bias``.
        Returns (weight (n_choices, F), bias (n_choices,)) on ``device``; the engine's exact fast path uses it."""
        return self.readout.weights_on(device)

    def predict_proba(self, features) -> np.ndarray:
        """(N, F) features -> (N, n_choices) float64 probabilities."""
        return self.readout.predict_proba(features)

    def accuracy(self, features, labels) -> float:
        """Fraction of the (N, F) samples whose most probable choice equals their label."""
        probabilities = self.predict_proba(features)
        labels = np.asarray(labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else labels)
        if labels.shape != (probabilities.shape[0],):
            raise ValueError(f"labels must have shape ({probabilities.shape[0]},), got {labels.shape}")
        predicted = np.asarray(self.choices)[probabilities.argmax(axis=1)]
        return float(np.mean(predicted == labels.astype(str)))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "layer": self.layer, "readout": self.readout.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> "LogisticDecoder":
        _check_keys(data, cls.kind, {"layer", "readout"})
        return cls(layer=_check_layer(data["layer"]), readout=LinearReadout.from_dict(data["readout"]))


def _pair_representation(features_a, features_b):
    """``|f_a - f_b|``, elementwise (numpy or torch)."""
    return abs(features_a - features_b)


@dataclass(frozen=True, eq=False)
class SameDifferentDecoder:
    """Same/different identity judgement on image pairs (Moeller et al. 2017, Nat Neurosci 20:743).

    The pair representation is the elementwise absolute difference ``|f_a - f_b|`` of the two images'
    features, standardised, read out by logistic regression with choices ("same", "different").
    Why this representation: it does not depend on which image came first, it is zero when the two
    representations are identical, and it lets the judgement depend only on how far the second
    image's activity lies from the first one's in each unit. That is the quantity stimulation acts
    on in a pair trial: the first image is seen unperturbed, stimulation perturbs the activity of
    the second, and a perturbation that moves activity away from the remembered first image pushes
    "same" pairs towards "different", as Moeller et al. observed inside face patches.

    Use :meth:`bind` with the unperturbed features of each pair's first image to get the
    :class:`Decoder` the engine calls.
    """

    layer: str
    readout: LinearReadout

    kind = "same_different"
    choices = SAME_DIFFERENT_CHOICES

    @classmethod
    def fit(cls, features_a, features_b, same, layer: str, C: float = 1e-3, standardize: bool = True,
            seed: int = 0, max_iter: int = 1000) -> "SameDifferentDecoder":
        """Fit on N unperturbed pairs: features_a, features_b (N, F), same (N,) bool."""
        layer = _check_layer(layer)
        first = _as_numpy_2d("features_a", features_a)
        second = _as_numpy_2d("features_b", features_b)
        if first.shape != second.shape:
            raise ValueError(f"features_a {first.shape} and features_b {second.shape} must have the same shape")
        same = np.asarray(same.detach().cpu().numpy() if isinstance(same, torch.Tensor) else same)
        if same.shape != (first.shape[0],) or same.dtype != np.bool_:
            raise ValueError(f"same must be a boolean array of shape ({first.shape[0]},), "
                             f"got dtype {same.dtype} and shape {same.shape}")
        codes = np.where(same, 0, 1)  # index into SAME_DIFFERENT_CHOICES
        readout = LinearReadout.fit(
            _pair_representation(first, second), codes, SAME_DIFFERENT_CHOICES, C=_check_positive("C", C),
            standardize=standardize, seed=seed, max_iter=_check_max_iter(max_iter),
        )
        return cls(layer=layer, readout=readout)

    def pair_probabilities(self, features_a, features_b) -> np.ndarray:
        """(N, F) and (N, F) -> (N, 2) float64 probabilities of ("same", "different")."""
        first = _as_numpy_2d("features_a", features_a)
        second = _as_numpy_2d("features_b", features_b)
        if first.shape != second.shape:
            raise ValueError(f"features_a {first.shape} and features_b {second.shape} must have the same shape")
        return self.readout.predict_proba(_pair_representation(first, second))

    def accuracy(self, features_a, features_b, same) -> float:
        """Fraction of pairs judged correctly (most probable choice)."""
        probabilities = self.pair_probabilities(features_a, features_b)
        same = np.asarray(same.detach().cpu().numpy() if isinstance(same, torch.Tensor) else same)
        if same.shape != (probabilities.shape[0],) or same.dtype != np.bool_:
            raise ValueError(f"same must be a boolean array of shape ({probabilities.shape[0]},)")
        return float(np.mean((probabilities[:, 0] > probabilities[:, 1]) == same))

    def bind(self, reference_features) -> "BoundSameDifferentDecoder":
        """Freeze the unperturbed features (B_ref, F) of the pairs' first images; the result's
        ``probabilities(features, stimulus_index)`` compares column b with reference
        ``stimulus_index[b]``."""
        return BoundSameDifferentDecoder(pair_decoder=self, reference_features=reference_features)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "layer": self.layer, "readout": self.readout.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> "SameDifferentDecoder":
        _check_keys(data, cls.kind, {"layer", "readout"})
        readout = LinearReadout.from_dict(data["readout"])
        if readout.choices != SAME_DIFFERENT_CHOICES:
            raise ConfigError(f"a same/different readout must have choices {SAME_DIFFERENT_CHOICES}, "
                              f"got {readout.choices}")
        return cls(layer=_check_layer(data["layer"]), readout=readout)


@dataclass(frozen=True, eq=False)
class BoundSameDifferentDecoder(Decoder):
    """A :class:`SameDifferentDecoder` with the first images of its pairs fixed.

    ``reference_features`` (B_ref, F) are the unperturbed features of the first image of each pair;
    ``probabilities(features (K, B, F), stimulus_index (B,))`` judges the pair
    (reference_features[stimulus_index[b]], features[k, b]) for every condition k and column b.
    """

    pair_decoder: SameDifferentDecoder
    reference_features: np.ndarray

    kind = "same_different_bound"
    choices = SAME_DIFFERENT_CHOICES

    def __post_init__(self):
        reference = _as_numpy_2d("reference_features", self.reference_features)
        if reference.shape[1] != self.pair_decoder.readout.n_features:
            raise ValueError(f"reference_features have {reference.shape[1]} features, the pair decoder was "
                             f"fitted on {self.pair_decoder.readout.n_features}")
        object.__setattr__(self, "reference_features", _frozen(reference))
        object.__setattr__(self, "_reference", torch.from_numpy(reference.copy()))

    @property
    def layer(self) -> str:
        return self.pair_decoder.layer

    def probabilities(self, features: torch.Tensor, stimulus_index: torch.Tensor | None = None) -> torch.Tensor:
        """(K, B, F) second-image features, (B,) reference rows -> (K, B, 2) P("same"), P("different")."""
        _check_batch(features)
        if stimulus_index is None:
            raise ValueError("a same/different decoder needs stimulus_index (B,): which reference (first "
                             "image) each of the B columns is paired with")
        index = torch.as_tensor(stimulus_index)
        if index.dtype not in (torch.int64, torch.int32) or index.shape != (features.shape[1],):
            raise ValueError(f"stimulus_index must be an integer tensor of shape ({features.shape[1]},), got "
                             f"dtype {index.dtype} and shape {tuple(index.shape)}")
        n_references = self.reference_features.shape[0]
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= n_references):
            raise ValueError(f"stimulus_index values must lie in [0, {n_references - 1}] "
                             f"(one per reference image), got [{int(index.min())}, {int(index.max())}]")
        reference = self._reference.to(features.device)[index.to(features.device).long()]
        return self.pair_decoder.readout.probabilities_torch(
            _pair_representation(features, reference.to(features.dtype)[None])
        )

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "pair_decoder": self.pair_decoder.to_dict(),
            "reference_features": self.reference_features.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "BoundSameDifferentDecoder":
        _check_keys(data, cls.kind, {"pair_decoder", "reference_features"})
        try:
            reference = np.asarray(data["reference_features"], dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"stored reference_features are not a numeric (B, F) table: {error}") from error
        return cls(pair_decoder=SameDifferentDecoder.from_dict(data["pair_decoder"]), reference_features=reference)


_DECODER_KINDS = {kind_cls.kind: kind_cls
                  for kind_cls in (LogisticDecoder, SameDifferentDecoder, BoundSameDifferentDecoder)}


def decoder_from_dict(data: dict):
    """Rebuild any decoder stored with ``to_dict`` (dispatches on its ``"kind"``)."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in _DECODER_KINDS:
        raise ConfigError(f"unknown decoder kind {kind!r}; known kinds are {sorted(_DECODER_KINDS)}")
    return _DECODER_KINDS[kind].from_dict(data)


def stratified_fit_mask(strata: dict, fit_fraction: float, rng: np.random.Generator, where: str,
                        noun: str) -> np.ndarray:
    """Which trials fit a decoder (True) and which test it: ``round(fit_fraction × n)`` of the ``n``
    members of every stratum, drawn without replacement by ``rng`` in the order of ``strata``
    (description → member indices into the trials; every trial in one stratum).

    Drawn here rather than by scikit-learn's ``StratifiedShuffleSplit``: its rounding spreads the
    remainders over strata, so a stratum's share would depend on the other strata, and the trials of
    every stored result would change. A stratum left without fitting or without test trials is a
    ``ConfigError`` naming ``where`` and the stratum's ``noun`` (e.g. "images").

    >>> mask = stratified_fit_mask({"class 'a'": np.array([0, 1, 2, 3]), "class 'b'": np.array([4, 5])},
    ...                            0.5, np.random.default_rng(0), "x.toml", "images")
    >>> int(mask[:4].sum()), int(mask[4:].sum())
    (2, 1)
    """
    n_trials = max((int(np.max(members)) + 1 for members in strata.values() if len(members)), default=0)
    is_fit = np.zeros(n_trials, dtype=bool)
    for description, members in strata.items():
        n_fit = int(round(fit_fraction * len(members)))
        if n_fit < 1 or n_fit > len(members) - 1:
            raise ConfigError(f"{where} [decoder]: fit_fraction = {fit_fraction} leaves {description} "
                              f"({len(members)} {noun}) without fitting or test {noun}; add {noun} or change it")
        is_fit[rng.choice(members, size=n_fit, replace=False)] = True
    return is_fit

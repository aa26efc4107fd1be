"""The implant's pose in the lab's anatomical frame (stereotaxic AP/ML, mm).

Convention: at ``rotation_deg`` = 0 the array's +x axis (columns, left → right on the map) points
anterior (+AP) and its +y axis (rows, bottom → top) points lateral; a positive rotation turns the
array counter-clockwise from anterior towards lateral. ML is signed with right = positive, so in
the left hemisphere lateral means negative ML (an ML of the other sign than the hemisphere's is refused, as are
positions outside a macaque brain). The reference point is one electrode (e.g. electrode 1, as surgeons note it)
or the array centre.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stimsim.lab.arrays.layout import ArrayLayout
from stimsim.utilities.errors import ConfigError

HEMISPHERES = ("left", "right")
#: Largest absolute AP and ML of a point of macaque cortex from ear-bar zero, mm (the brain is about 60 mm long
#: and 50 mm wide): a larger value is a unit mistake (µm typed as mm).
MAX_AP_MM, MAX_ML_MM = 60.0, 40.0


@dataclass(frozen=True)
class AnatomicalPose:
    """AP/ML (mm) of ``reference`` (an electrode id, or ``"centre"``), rotation (deg), hemisphere."""

    ap_mm: float
    ml_mm: float
    rotation_deg: float = 0.0
    hemisphere: str = "right"
    reference: str = "centre"

    def __post_init__(self):
        for key in ("ap_mm", "ml_mm", "rotation_deg"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"anatomical pose: {key} must be a finite number, got {value!r}")
            object.__setattr__(self, key, float(value))
        if self.hemisphere not in HEMISPHERES:
            raise ConfigError(f"anatomical pose: hemisphere must be one of {list(HEMISPHERES)}, got {self.hemisphere!r}")
        for key, largest in (("ap_mm", MAX_AP_MM), ("ml_mm", MAX_ML_MM)):
            if abs(getattr(self, key)) > largest:
                raise ConfigError(f"anatomical pose: {key} = {getattr(self, key):g} mm lies outside a macaque brain "
                                  f"(|{key}| <= {largest:g} mm); is it in µm?")
        if not -360 <= self.rotation_deg <= 360:
            raise ConfigError(f"anatomical pose: rotation_deg must lie in [-360, 360], got {self.rotation_deg:g}")
        if self.ml_mm != 0 and (self.ml_mm < 0) != (self.hemisphere == "left"):
            raise ConfigError(f"anatomical pose: ml_mm = {self.ml_mm:g} lies in the other hemisphere than "
                              f"{self.hemisphere!r}: ML is signed, right of the midline positive, left negative "
                              f"(give ml_mm = {-self.ml_mm:g} for {abs(self.ml_mm):g} mm {self.hemisphere} of it)")
        object.__setattr__(self, "reference", str(self.reference))

    def to_anatomical(self, layout: ArrayLayout, points_mm) -> np.ndarray:
        """(N, 2) array-frame points (mm) → (N, 2) columns (ap_mm, ml_mm)."""
        points = np.asarray(points_mm, dtype=np.float64).reshape(-1, 2)
        origin = np.zeros(2) if self.reference == "centre" else np.asarray(layout.position_of(self.reference))
        theta = math.radians(self.rotation_deg)
        c, s = math.cos(theta), math.sin(theta)
        anterior_lateral = (points - origin) @ np.array([[c, -s], [s, c]]).T
        sign = 1.0 if self.hemisphere == "right" else -1.0
        return np.column_stack([self.ap_mm + anterior_lateral[:, 0], self.ml_mm + sign * anterior_lateral[:, 1]])

    def electrode_coordinates(self, layout: ArrayLayout) -> dict:
        """Electrode id → (ap_mm, ml_mm)."""
        coords = self.to_anatomical(layout, layout.positions_mm)
        return {i: (float(a), float(m)) for i, (a, m) in zip(layout.electrode_ids, coords)}

    def to_dict(self) -> dict:
        return {"ap_mm": self.ap_mm, "ml_mm": self.ml_mm, "rotation_deg": self.rotation_deg,
                "hemisphere": self.hemisphere, "reference": self.reference}

    @classmethod
    def from_dict(cls, data: dict) -> "AnatomicalPose":
        allowed = {"ap_mm", "ml_mm", "rotation_deg", "hemisphere", "reference"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ConfigError(f"anatomical pose: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        missing = [k for k in ("ap_mm", "ml_mm") if k not in data]
        if missing:
            raise ConfigError(f"anatomical pose: missing key(s) {missing}")
        return cls(**data)

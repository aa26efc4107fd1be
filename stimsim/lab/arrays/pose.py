"""Where an array sits on a cortical sheet: translation (mm), rotation (deg), optional scale."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from stimsim.utilities.errors import ConfigError


@dataclass(frozen=True)
class ArrayPose:
    """Pose of an array on a sheet: an array-frame point p lands at ``R(rotation_deg)·scale·p + (x_mm, y_mm)``
    (rotation counter-clockwise about the array centre, then scale, then translation of the centre)."""

    x_mm: float
    y_mm: float
    rotation_deg: float = 0.0
    scale: float = 1.0

    def __post_init__(self):
        for key in ("x_mm", "y_mm", "rotation_deg", "scale"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
                raise ConfigError(f"array pose: {key} must be a finite number, got {value!r}")
            object.__setattr__(self, key, float(value))
        if self.scale <= 0:
            raise ConfigError(f"array pose: scale must be > 0, got {self.scale}")

    def matrix(self) -> np.ndarray:
        """2×2 linear part (rotation × scale)."""
        theta = math.radians(self.rotation_deg)
        c, s = math.cos(theta), math.sin(theta)
        return self.scale * np.array([[c, -s], [s, c]])

    def apply(self, points_mm) -> np.ndarray:
        """Map (N, 2) array-frame points (mm) onto the sheet (mm)."""
        points = np.asarray(points_mm, dtype=np.float64).reshape(-1, 2)
        return points @ self.matrix().T + np.array([self.x_mm, self.y_mm])

    def inverse(self, sheet_points_mm) -> np.ndarray:
        """Map (N, 2) sheet points (mm) back into the array frame (mm)."""
        points = np.asarray(sheet_points_mm, dtype=np.float64).reshape(-1, 2) - np.array([self.x_mm, self.y_mm])
        return points @ np.linalg.inv(self.matrix()).T

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ArrayPose":
        unknown = sorted(set(data) - {"x_mm", "y_mm", "rotation_deg", "scale"})
        if unknown:
            raise ConfigError(f"array pose: unknown key(s) {unknown}; allowed: x_mm, y_mm, rotation_deg, scale")
        missing = [k for k in ("x_mm", "y_mm") if k not in data]
        if missing:
            raise ConfigError(f"array pose: missing key(s) {missing}")
        return cls(**data)


def angle_difference_deg(a_deg: float, b_deg: float) -> float:
    """Smallest absolute difference between two angles, deg (0–180)."""
    return float(abs((a_deg - b_deg + 180.0) % 360.0 - 180.0))


def pose_error(estimate: ArrayPose, truth: ArrayPose) -> dict:
    """``pose_error_mm`` (distance between the array centres) and ``pose_error_deg`` (rotation)."""
    return {"pose_error_mm": float(math.hypot(estimate.x_mm - truth.x_mm, estimate.y_mm - truth.y_mm)),
            "pose_error_deg": angle_difference_deg(estimate.rotation_deg, truth.rotation_deg),
            "scale_ratio": estimate.scale / truth.scale}

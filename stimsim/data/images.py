"""Reading image files: one decoder for every stimulus set and model input."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from stimsim.utilities.errors import FileFormatError


class TransparentImageWarning(UserWarning):
    """An image file (``path``) with transparent pixels: its alpha is dropped when it is read."""

    def __init__(self, path):
        self.path = Path(path)
        super().__init__(f"{path}: the image has transparent pixels; its alpha is dropped, so they show the colour "
                         "stored under them (flatten it onto the background the monkey saw)")


def load_image(path) -> np.ndarray:
    """Read an image file as a float32 array in [0, 1], (H, W) or (H, W, 3).

    8-bit images are divided by 255 and 16-bit ones (``I;16`` PNG and TIFF, or integer images within
    0–65535) by 65535, so an image keeps its contrast whatever its bit depth; floating-point images
    (``F``) are taken as they are and must lie in [0, 1]. Colour modes (palette, CMYK, RGBA, ...) become
    RGB, alpha dropped; gray modes stay gray. An image with transparent pixels (less than half opaque) gives a
    :class:`TransparentImageWarning`: those pixels show the colour stored under them, not the background a
    monkey saw them on.
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        with Image.open(path) as img:
            img.load()
            if img.mode.startswith("I;16"):
                return np.asarray(img, dtype=np.float32) / MAX_16_BIT
            if img.mode in ("I", "F"):
                return _wide_gray(np.asarray(img, dtype=np.float64), img.mode, path)
            if _is_transparent(img):
                warnings.warn(TransparentImageWarning(path), stacklevel=2)
            img = img.convert("L") if img.mode in ("L", "1", "LA") else img.convert("RGB")
            arr = np.asarray(img, dtype=np.float32) / 255.0
    except FileNotFoundError:
        raise FileNotFoundError(f"image file not found: {path}") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise FileFormatError(path, f"cannot decode image ({exc})") from None
    return arr


def _is_transparent(img) -> bool:
    """Whether a PIL image (with an alpha channel or a transparent palette colour) has a pixel less than half opaque;
    slight translucency, as anti-aliased edges have, leaves the image as it looked."""
    if img.mode not in ("RGBA", "LA", "PA", "RGBa", "La") and "transparency" not in img.info:
        return False
    return img.convert("RGBA").getchannel("A").getextrema()[0] < 128


#: Largest value of a 16-bit image: its white.
MAX_16_BIT = 65535.0


def _wide_gray(values: np.ndarray, mode: str, path: Path) -> np.ndarray:
    """A 32-bit integer (``I``) or floating-point (``F``) gray image in [0, 1]: integers are read as 16-bit
    values, floats as they are; values outside that range are a FileFormatError (nothing is rescaled)."""
    top = MAX_16_BIT if mode == "I" else 1.0
    if values.size == 0 or not np.all(np.isfinite(values)) or values.min() < 0 or values.max() > top:
        low, high = (float(np.nanmin(values)), float(np.nanmax(values))) if values.size else (0.0, 0.0)
        kind = "integer image (read as 16-bit, 0-65535)" if mode == "I" else "floating-point image (read as 0-1)"
        raise FileFormatError(path, f"{kind} has values from {low:g} to {high:g}, outside its range; save it "
                                    "as an 8-bit or 16-bit image")
    return (values / top).astype(np.float32)

"""Reading image files: one decoder for every stimulus set and model input."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stimsim.errors import FileFormatError


def load_image(path) -> np.ndarray:
    """Read an image file as a float32 array in [0, 1], (H, W) or (H, W, 3)."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        with Image.open(path) as img:
            img.load()
            if img.mode in ("I;16", "I;16B", "I"):
                arr = np.asarray(img, dtype=np.float32)
                return arr / max(float(arr.max()), 1.0)
            img = img.convert("L") if img.mode in ("L", "1", "LA") else img.convert("RGB")
            arr = np.asarray(img, dtype=np.float32) / 255.0
    except FileNotFoundError:
        raise FileNotFoundError(f"image file not found: {path}") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise FileFormatError(path, f"cannot decode image ({exc})") from None
    return arr

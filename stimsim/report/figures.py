"""Figures as PNG bytes, ready to embed in a report (matplotlib on the headless Agg backend)."""
from __future__ import annotations

import io

import numpy as np

from stimsim.utilities.figures import pyplot


def figure_png(fig, dpi: int = 110) -> bytes:
    """PNG bytes of a matplotlib figure; the figure is closed afterwards."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        pyplot().close(fig)
    return buffer.getvalue()


def image_png(image, scale: int = 1) -> bytes:
    """PNG bytes of one image: (H, W) grayscale or (H, W, 3) RGB with values in [0, 1]; each pixel is
    repeated ``scale`` times along both axes (crisp thumbnails of small images)."""
    from PIL import Image as PILImage

    array = np.asarray(image, dtype=np.float64)
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = np.moveaxis(array, 0, -1)  # (C, H, W) → (H, W, C)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] != 3):
        raise ValueError(f"image must be (H, W) grayscale or (H, W, 3) RGB, got shape {array.shape}")
    if not np.all(np.isfinite(array)) or array.min() < 0 or array.max() > 1:
        raise ValueError("image values must be finite and in [0, 1]")
    if isinstance(scale, bool) or not isinstance(scale, (int, np.integer)) or scale < 1:
        raise ValueError(f"scale must be an integer >= 1, got {scale!r}")
    pixels = np.round(array * 255).astype(np.uint8)
    if scale > 1:
        pixels = pixels.repeat(scale, axis=0).repeat(scale, axis=1)
    buffer = io.BytesIO()
    PILImage.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()

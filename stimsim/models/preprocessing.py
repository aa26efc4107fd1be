"""Turn plain images (files, PIL images, arrays, tensors) into a model's input tensor."""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from stimsim.data.images import load_image
from stimsim.data.stimuli import StimulusSet
from stimsim.utilities.errors import ConfigError

#: ITU-R BT.601 luma weights for RGB → grayscale.
_LUMA_RGB = (0.299, 0.587, 0.114)


#: The sides (px) a model's input may have: a few pixels up to well above any vision network's (224 for ImageNet).
MIN_SIZE_PX, MAX_SIZE_PX = 8, 2048


@dataclass(frozen=True)
class Preprocessing:
    """How a model wants its images.

    Calling it gives the normalised input tensor; :meth:`geometry` gives the images at the input's
    size and colour, not normalised, for changes that must be made where the network sees them
    (pixel noise).

    Parameters
    ----------
    size_px : images are resized so that their shorter side is size_px (aspect kept; bilinear,
        antialiased), then the centre size_px × size_px square is cut out, as ImageNet networks
        expect (a square image is simply resized).
    channels : 1 (grayscale) or 3 (RGB); colour images are converted to luma (ITU-R BT.601 weights),
        gray ones repeated on the three channels; an alpha channel is dropped.
    mean, std : per-channel normalisation applied to intensities in [0, 1].
    """

    size_px: int = 224
    channels: int = 3
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)

    def __post_init__(self):
        if isinstance(self.size_px, bool) or not isinstance(self.size_px, numbers.Integral) or not (
                MIN_SIZE_PX <= self.size_px <= MAX_SIZE_PX):
            raise ConfigError(f"preprocessing.size_px must be an integer in [{MIN_SIZE_PX}, {MAX_SIZE_PX}] (px), got "
                              f"{self.size_px!r}")
        if isinstance(self.channels, bool) or self.channels not in (1, 3):
            raise ConfigError(f"preprocessing.channels must be 1 or 3, got {self.channels!r}")
        object.__setattr__(self, "size_px", int(self.size_px))
        object.__setattr__(self, "channels", int(self.channels))
        for name in ("mean", "std"):
            values = getattr(self, name)
            values = values.tolist() if isinstance(values, np.ndarray) and values.ndim == 1 else values
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != self.channels \
                    or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
                               for v in values):
                raise ConfigError(f"preprocessing.{name} must be {self.channels} finite number(s), one per channel "
                                  f"(intensities in [0, 1]), got {values!r}")
            object.__setattr__(self, name, tuple(float(v) for v in values))
        if min(self.std) <= 0:
            raise ConfigError(f"preprocessing.std values must be > 0, got {self.std}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Preprocessing":
        unknown = set(values) - {"size_px", "channels", "mean", "std"}
        if unknown:
            raise ConfigError(f"unknown preprocessing key(s) {sorted(unknown)}")
        return cls(**values)

    def __call__(self, images, device=None) -> torch.Tensor:
        """Images → float32 tensor (N, channels, size_px, size_px), normalised, computed on ``device``
        (default: the CPU, or where a tensor given as ``images`` already is). Every image is brought to
        the input geometry on its own (see :meth:`geometry`), so an image's input does not depend on
        the other images of the call."""
        batch = self._input_batch(images, device)
        mean = torch.tensor(self.mean, device=batch.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=batch.device).view(1, -1, 1, 1)
        return (batch - mean) / std

    def geometry(self, images) -> list[np.ndarray]:
        """Each image as the network receives it, before normalisation: float32 in [0, 1],
        (size_px, size_px) for a 1-channel model, (size_px, size_px, 3) for a 3-channel one.

        Every image on its own: its shorter side resized to ``size_px`` (aspect kept; bilinear,
        antialiased) and the centre square cut out; colour matched explicitly — RGB becomes
        ITU-R BT.601 luma (0.299 R + 0.587 G + 0.114 B) for a grayscale model, a gray image is
        repeated on the three channels of an RGB model, an alpha channel is dropped. ``images``: a
        sequence of anything the model takes (paths, PIL images, arrays, (C, H, W) tensors), a stacked
        array (N, H, W[, C]), a tensor (N, C, H, W) or a :class:`~stimsim.data.stimuli.StimulusSet`. Images
        already at this geometry pass through the model's preprocessing unchanged but for the normalisation, so
        a change made to them — pixel noise above all — reaches the network pixel for pixel.

        >>> gray_model = Preprocessing(size_px=8, channels=1, mean=(0.5,), std=(0.5,))
        >>> wide = np.zeros((16, 32, 3), np.float32)
        >>> wide[:, 6:26] = (1.0, 0.0, 0.0)  # red, but for 6 black columns on each side: cut away with the sides
        >>> [square] = gray_model.geometry([wide])
        >>> square.shape, round(float(square.min()), 3), round(float(square.max()), 3)  # luma of pure red
        ((8, 8), 0.299, 0.299)
        """
        batch = self._input_batch(images).clamp(0.0, 1.0).permute(0, 2, 3, 1).cpu().numpy()
        return [image[..., 0] if self.channels == 1 else image for image in batch]

    def _input_batch(self, images, device=None) -> torch.Tensor:
        """``images`` → (N, channels, size_px, size_px) in [0, 1], each image colour-matched, resized and
        cropped on its own. A tensor (N, C, H, W) or a stacked array holds images of one size, which
        are converted together (no resize at all when they are at the input size already); a list is
        converted in groups of images of one size and channel count (each image's result is the same as
        alone: resizing treats every image of a batch separately), then put back in order."""
        if isinstance(images, torch.Tensor):
            return self._to_input_geometry(_tensor_to_unit(images, device))
        if isinstance(images, np.ndarray) and _is_stacked(images):
            return self._to_input_geometry(_array_to_unit(images, device, stacked=True))
        singles = [_array_to_unit(_single_to_array(item), device, stacked=False) for item in image_sequence(images)]
        if not singles:
            raise ValueError("no images given")
        positions_by_shape: dict[tuple[int, ...], list[int]] = {}
        for position, single in enumerate(singles):
            positions_by_shape.setdefault(tuple(single.shape), []).append(position)
        converted = [None] * len(singles)
        for positions in positions_by_shape.values():
            group = self._to_input_geometry(torch.cat([singles[position] for position in positions]))
            for position, image in zip(positions, group):
                converted[position] = image
        return torch.stack(converted)

    def _to_input_geometry(self, batch: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) in [0, 1], all of one size → (N, channels, size_px, size_px): colour matched,
        resized, cropped."""
        batch = _match_channels(batch, self.channels)
        if batch.shape[-2:] != (self.size_px, self.size_px):
            batch = resize_centre_crop(batch, self.size_px).clamp_(0.0, 1.0)
        return batch


def resize_centre_crop(batch: torch.Tensor, size_px: int) -> torch.Tensor:
    """(N, C, H, W) images in [0, 1] → (N, C, size_px, size_px): the shorter side resized to ``size_px``
    (aspect kept; bilinear, antialiased), then the centre square cut out.

    >>> wide = torch.zeros(1, 1, 8, 24)
    >>> wide[..., 6:18] = 1.0  # dark left and right quarters, cut away with the sides
    >>> square = resize_centre_crop(wide, 4)
    >>> tuple(square.shape), square.min().item()
    ((1, 1, 4, 4), 1.0)
    """
    height, width = batch.shape[-2:]
    if (height, width) == (size_px, size_px):
        return batch
    scale = size_px / min(height, width)
    resized = (max(size_px, round(height * scale)), max(size_px, round(width * scale)))
    batch = F.interpolate(batch, size=resized, mode="bilinear", align_corners=False, antialias=True)
    top, left = (resized[0] - size_px) // 2, (resized[1] - size_px) // 2
    return batch[..., top:top + size_px, left:left + size_px]


#: Integer image types and their full intensity, as image files are read (:func:`stimsim.data.images.load_image`).
_FULL_SCALE = {"uint8": 255.0, "uint16": 65535.0}


def _unit_values(tensor: torch.Tensor) -> torch.Tensor:
    """Image values as float32 in [0, 1]: uint8 divided by 255, uint16 by 65535, floating point as given; other
    types, and floating-point values that are not finite or lie outside [0, 1], refused (ValueError)."""
    kind = str(tensor.dtype).removeprefix("torch.")
    if kind in _FULL_SCALE:
        return tensor.to(torch.float32) / _FULL_SCALE[kind]
    if not tensor.is_floating_point():
        raise ValueError(f"images of type {kind}: give floating-point values in [0, 1], or uint8 (0-255) or uint16 "
                         "(0-65535) values")
    tensor = tensor.to(torch.float32)
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError("images hold NaN or infinite values; give finite values in [0, 1]")
    if float(tensor.min()) < 0.0 or float(tensor.max()) > 1.0:
        raise ValueError(f"floating-point images must hold values in [0, 1], got values from {float(tensor.min()):g} "
                         f"to {float(tensor.max()):g} (8-bit values as floats: divide them by 255, or give uint8)")
    return tensor


def _tensor_to_unit(images: torch.Tensor, device=None) -> torch.Tensor:
    """A (C, H, W) or (N, C, H, W) tensor (see :func:`_unit_values`) → float32 (N, C, H, W) on ``device``."""
    tensor = images.detach()
    if tensor.dim() == 3:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() != 4 or tensor.shape[1] not in (1, 3, 4):
        raise ValueError(f"image tensors must be (C, H, W) or (N, C, H, W) with C = 1, 3 or 4 (channels first), got "
                         f"shape {tuple(images.shape)}")
    if tensor.shape[0] == 0:
        raise ValueError("no images given (a tensor of 0 images)")
    _check_image_size(tuple(tensor.shape[-2:]))
    tensor = _unit_values(tensor if device is None else tensor.to(device))
    return tensor[:, :3]


def _array_to_unit(arr: np.ndarray, device=None, *, stacked: bool) -> torch.Tensor:
    """One image array ((H, W) or (H, W, 1|3|4)) or a stack of them (N, H, W[, C]) (see :func:`_unit_values`) →
    float32 (N, C, H, W) in [0, 1] on ``device``, alpha dropped."""
    arr = np.asarray(arr)
    if not stacked:
        arr = arr[None]
    if arr.ndim == 3:
        arr = arr[..., None]
    if arr.ndim != 4 or arr.shape[-1] not in (1, 3, 4):
        raise ValueError(f"an image array must be (H, W) or (H, W, 1|3|4), got shape {arr.shape[1:]}")
    if arr.shape[0] == 0:
        raise ValueError("no images given (an array of 0 images)")
    _check_image_size(arr.shape[1:3])
    if arr.dtype.byteorder not in ("=", "|"):
        arr = arr.astype(arr.dtype.newbyteorder("="))
    tensor = torch.from_numpy(np.ascontiguousarray(arr[..., :3])).permute(0, 3, 1, 2).contiguous()
    return _unit_values(tensor if device is None else tensor.to(device))


def _check_image_size(height_width) -> None:
    """Refuse (ValueError) images without a pixel: an image is at least 1 × 1 px."""
    if min(height_width) < 1:
        raise ValueError(f"images must be at least 1 × 1 px, got {height_width[1]} × {height_width[0]} px (width × "
                         "height)")


def _is_stacked(arr: np.ndarray) -> bool:
    """Whether an array holds several images (N, H, W[, C]) rather than one ((H, W) or (H, W, 3|4))."""
    return not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] in (3, 4)))


def input_geometry_notes(images: StimulusSet, size_px: int, where: str) -> list[str]:
    """Sentences on how many images a model's input geometry changes much: their shorter side resized to ``size_px``
    and the centre square cut out, so an image over twice as long as wide loses over half of its length, and one
    under a quarter of ``size_px`` is enlarged over 4 times (empty when none is)."""
    shapes = [image.shape[:2] for image in images.images]
    checks = (
        (lambda h, w: max(h, w) > 2 * min(h, w),
         "are over twice as long as wide, and the model sees only their centre square"),
        (lambda h, w: 4 * min(h, w) < size_px, f"are enlarged over 4 times to the model's {size_px}-px input"))
    notes = []
    for changed, what in checks:
        hits = [i for i, (h, w) in enumerate(shapes) if changed(h, w)]
        if hits:
            h, w = shapes[hits[0]]
            notes.append(f"{where}: {len(hits)} of {len(shapes)} images {what} (e.g. {images.stimulus_id[hits[0]]}, "
                         f"{w} × {h} px)")
    return notes


def image_sequence(images):
    """``images`` as a sequence with one entry per image, to count and slice by image: a single image (a file path,
    a PIL image, an (H, W[, C]) array, a (C, H, W) tensor) becomes a sequence of one; a stacked array or tensor, a
    list and a :class:`~stimsim.data.stimuli.StimulusSet`'s images are taken as they are."""
    if images is None:
        raise ValueError("no images given (None)")
    if isinstance(images, StimulusSet):
        return images.images
    if isinstance(images, torch.Tensor):
        return images.unsqueeze(0) if images.dim() == 3 else images
    if isinstance(images, np.ndarray):
        return images if _is_stacked(images) else images[None]
    if isinstance(images, (str, Path)) or _is_pil(images):
        return [images]
    if isinstance(images, (bytes, dict)) or not (hasattr(images, "__len__") and hasattr(images, "__getitem__")):
        raise TypeError(f"images must be an image (a file path, a PIL image, an (H, W[, C]) array, a (C, H, W) "
                        f"tensor), a list of images, a stacked array or tensor, or a StimulusSet; got "
                        f"{type(images).__name__}")
    return images


def _is_pil(obj) -> bool:
    from PIL import Image

    return isinstance(obj, Image.Image)


def _single_to_array(item) -> np.ndarray:
    if isinstance(item, (str, Path)):
        return load_image(item)
    if _is_pil(item):
        return np.asarray(item.convert("RGB") if item.mode not in ("L", "RGB") else item, dtype=np.float32) / 255.0
    if isinstance(item, torch.Tensor):
        return item.detach().cpu().numpy().transpose(1, 2, 0) if item.dim() == 3 else item.detach().cpu().numpy()
    return np.asarray(item)


def _match_channels(batch: torch.Tensor, channels: int) -> torch.Tensor:
    if batch.shape[1] == channels:
        return batch
    if channels == 1:
        weights = torch.tensor(_LUMA_RGB, dtype=batch.dtype, device=batch.device).view(1, 3, 1, 1)
        return (batch * weights).sum(1, keepdim=True)
    return batch.expand(-1, 3, -1, -1)

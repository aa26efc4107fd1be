"""Compute devices: ``cpu``, ``cuda`` (``cuda:N``), ``mps`` or ``auto`` (a GPU when present, else the CPU).

Every entry point that computes (``simulate``, model loading and activations, decoders, training,
``stimsim run | plan | visualize | subject make | train | models check | bench``) takes a device through
:func:`resolve_device`, so a missing accelerator is one clear error rather than a CUDA traceback deep in torch.

On CUDA, convolutions and matrix products run in full float32: resolving a CUDA device turns TensorFloat-32 off
for the whole process (:func:`full_float32_on_cuda`). PyTorch's default keeps it on for cuDNN convolutions, and on
an H200 it moved choice probabilities by up to 1.8e-4 from the CPU's; without it they agree within 1e-4.
"""
from __future__ import annotations

import argparse

import torch

from stimsim.utilities.errors import ConfigError

#: Device names accepted on the command line (``cuda:N`` picks one GPU).
DEVICE_CHOICES = ("cpu", "cuda", "mps", "auto")


def resolve_device(device="cpu") -> torch.device:
    """The ``torch.device`` for ``device`` (a name, ``cuda:N`` or a ``torch.device``); ``auto`` is CUDA,
    then MPS, then the CPU. Raises ConfigError when the device is unknown or not available here."""
    if device is None:
        device = "cpu"
    if isinstance(device, torch.device):
        name = str(device)
    elif isinstance(device, str):
        name = device.strip().lower()
    else:
        raise ConfigError(f"device must be one of {', '.join(DEVICE_CHOICES)} (or cuda:N), got {device!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu"
    try:
        resolved = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"unknown device {device!r}; use one of {', '.join(DEVICE_CHOICES)} (or cuda:N)") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} requested but CUDA is not available on this machine "
                              f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}); "
                              "use --device cpu")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r} requested but this machine has {torch.cuda.device_count()} "
                              "CUDA device(s)")
        full_float32_on_cuda()
    elif resolved.type == "mps":
        if not _mps_available():
            raise ConfigError(f"device {name!r} requested but Apple MPS is not available on this machine; "
                              "use --device cpu")
    elif resolved.type != "cpu":
        raise ConfigError(f"unknown device {device!r}; use one of {', '.join(DEVICE_CHOICES)} (or cuda:N)")
    return resolved


def full_float32_on_cuda() -> None:
    """Turn TensorFloat-32 off for CUDA convolutions and matrix products, process-wide (PyTorch ≥ 2.9 names it
    ``fp32_precision = "ieee"``, older versions ``allow_tf32 = False``)."""
    conv, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    if hasattr(getattr(conv, "conv", None), "fp32_precision") and hasattr(matmul, "fp32_precision"):
        conv.conv.fp32_precision = "ieee"
        matmul.fp32_precision = "ieee"
    else:
        conv.allow_tf32 = False
        matmul.allow_tf32 = False


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device cpu|cuda|mps|auto`` (default cpu) on a command."""
    parser.add_argument("--device", default="cpu", metavar="DEVICE",
                        help="where to compute: cpu (default), cuda, cuda:N, mps, or auto (a GPU when present)")

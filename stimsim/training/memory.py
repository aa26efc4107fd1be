"""The memory a training run needs, checked before it starts: the network's weights with the copies a training
step holds beside them, and the activations a batch keeps for the backward pass, both counted on torch's ``meta``
device, which holds sizes but no numbers."""
from __future__ import annotations

import torch

from stimsim.models.architectures import build_network
from stimsim.utilities.limits import check_memory, format_bytes

#: Copies of the network's weights that a training step holds beside them: the gradients, SGD's momentum and the two
#: temporaries of its update (weight decay, Nesterov momentum).
TRAINING_COPIES = 4


def check_training_memory(config, on_cpu: bool) -> None:
    """Refuse (ConfigError), before the network of ``config`` (a :class:`~stimsim.training.loop.TrainingConfig`) is
    built, one whose weights need more memory than is available, with :data:`TRAINING_COPIES` copies of them and the
    activations of a training batch when it trains ``on_cpu`` (on another device those are held there). The network is first built on torch's ``meta``
    device, which holds no numbers: building it for real would itself allocate its weights (bytes)."""
    try:
        with torch.device("meta"):
            network = build_network(config.family, **config.model_kwargs)
    except Exception:  # a builder that cannot build there, or kwargs that do not fit: the real build says why
        return
    weights = sum(parameter.numel() * parameter.element_size() for parameter in network.parameters())
    sizes = ", ".join(f"{key} = {value}" for key, value in config.model_kwargs.items()
                      if isinstance(value, int) and not isinstance(value, bool))
    copies = TRAINING_COPIES if on_cpu else 0
    check_memory(f"{config.source}: training {config.name!r} ({format_bytes(weights)} of weights)",
                 (1 + copies) * weights, f"the layer sizes in [model] kwargs{f' ({sizes})' if sizes else ''}")
    if not on_cpu:
        return
    batch = config.batch_size * (1 if config.task == "supervised" else 2)  # SimCLR passes two views of each image
    activations = activation_bytes(network, batch, config.preprocessing)
    check_memory(f"{config.source}: training {config.name!r} on batches of {batch} images at "
                 f"{config.preprocessing.size_px} px ({format_bytes(activations)} of activations kept for the "
                 "backward pass)", (1 + copies) * weights + 2 * activations,  # the activations and their gradients
                 "[training] batch_size or [model.preprocessing] size_px")


def activation_bytes(network: torch.nn.Module, batch: int, preprocessing) -> int:
    """Bytes of the outputs of every module without submodules in one forward pass of ``batch`` images through
    ``network`` built on the ``meta`` device (sizes without numbers): what backpropagation keeps. 0 for a network
    whose forward pass cannot run there."""
    total = 0

    def count(module, inputs, output):
        nonlocal total
        for tensor in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()

    leaves = [module for module in network.modules() if next(module.children(), None) is None]
    handles = [module.register_forward_hook(count) for module in leaves]
    try:
        size = preprocessing.size_px
        network(torch.empty(batch, preprocessing.channels, size, size, device="meta"))
    except Exception:  # an operation without a meta kernel: the real run's allocator decides
        return 0
    finally:
        for handle in handles:
            handle.remove()
    return total

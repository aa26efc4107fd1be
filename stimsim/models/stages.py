"""Splitting any traceable network into named stages with ``torch.fx``.

A perturbation acts on the output of one layer; the engine then runs only what comes after it. So
a network is cut into an ordered list of stages: stage *k* maps the output of stage *k − 1* to the
output of the module named *k* (a name as in ``print(model)``, e.g. ``"layer4.1"`` or
``"features.17"``), and the last stages end at the network's output. Functional calls between
modules (``F.adaptive_avg_pool2d``, ``torch.flatten``, additions) belong to the stage that follows
them, so networks that are not a plain chain of children — MobileNetV2, EfficientNet, a user's own —
split as well.

A module can be a stage when its output is the only value that later computation needs from before
it (no skip connection passes around it) and it is called once. By default the stages are the
network's top-level children, each ``nn.Sequential`` child opened one level (``layer4`` →
``layer4.0``, ``layer4.1``); any other module named in ``layers`` (e.g. a layer inside a block) is made
a stage too. The split is checked against the network's own forward pass.
"""
from __future__ import annotations

import torch
from torch import fx, nn

from stimsim.utilities.errors import ConfigError

#: Name of the stage that holds computation after the last module stage, when there is any.
OUTPUT_STAGE = "output"


class _LeafTracer(fx.Tracer):
    """Traces through every module except those named in ``leaves`` (and torch's own leaf modules)."""

    def __init__(self, leaves: set[str]):
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        if qualified_name in self.leaves:
            return True
        if isinstance(module, nn.Sequential) or any(name.startswith(qualified_name + ".") for name in self.leaves
                                                     if qualified_name):
            return False
        return super().is_leaf_module(module, qualified_name)


def default_layers(network: nn.Module, open_sequentials: bool = True) -> list[str]:
    """Top-level children, each non-empty ``nn.Sequential`` child opened one level (if ``open_sequentials``)."""
    names = []
    for name, child in network.named_children():
        if open_sequentials and isinstance(child, nn.Sequential) and len(child) > 0:
            names.extend(f"{name}.{sub}" for sub, _ in child.named_children())
        else:
            names.append(name)
    return names


def split_network(network: nn.Module, example_input: torch.Tensor, layers=(),
                  open_sequentials: bool = True) -> list[tuple[str, nn.Module]]:
    """Named stages that reproduce ``network``'s forward pass in order (see the module docstring).

    ``layers`` : module names that must be stages (a ``ConfigError`` says why one cannot be).
    ``open_sequentials`` : open top-level ``nn.Sequential`` children one level for the default stages.
    """
    modules = dict(network.named_modules())
    wanted = [str(layer) for layer in layers]
    unknown = [layer for layer in wanted if layer not in modules or not layer]
    if unknown:
        raise ConfigError(f"{unknown} are not modules of {type(network).__name__}; layer names are module names "
                          f"as print(model) shows them, e.g. {default_layers(network, open_sequentials)[:6]}")
    nested = [(outer, inner) for outer in wanted for inner in wanted if inner.startswith(outer + ".")]
    if nested:
        outer, inner = nested[0]
        raise ConfigError(f"layers {outer!r} and {inner!r} of {type(network).__name__} cannot both be stages: "
                          f"{inner!r} is inside {outer!r}; give one of them")
    leaves = set(default_layers(network, open_sequentials))
    for layer in wanted:  # a wanted layer inside a default stage: trace through its ancestors instead
        leaves = {leaf for leaf in leaves if not layer.startswith(leaf + ".")} | {layer}
    try:
        graph = _LeafTracer(leaves).trace(network)
    except Exception as exc:  # fx raises many types for code it cannot trace
        raise ConfigError(f"{type(network).__name__} cannot be traced by torch.fx ({type(exc).__name__}: {exc}); "
                          "stimsim needs a forward pass without data-dependent control flow") from None
    module = fx.GraphModule(network, graph)
    nodes = list(module.graph.nodes)
    calls: dict[str, list[fx.Node]] = {}
    for node in nodes:
        if node.op == "call_module":
            calls.setdefault(str(node.target), []).append(node)
    cuts = [node for node in nodes if node.op == "call_module" and len(calls[str(node.target)]) == 1
            and _is_cut(nodes, node)]
    cut_names = [str(node.target) for node in cuts]
    for layer in wanted:
        if layer not in cut_names:
            why = (f"it is called {len(calls[layer])} times" if len(calls.get(layer, [])) > 1 else
                   "later computation also uses values from before it (e.g. a skip connection passes around it)"
                   if layer in calls else "it is not called by the forward pass")
            raise ConfigError(f"layer {layer!r} of {type(network).__name__} cannot be a stage: {why}; "
                              f"stages: {cut_names}")
    output = next(node for node in nodes if node.op == "output")
    stages, start = [], None
    for node in cuts:
        stages.append((str(node.target), _segment(module, nodes, start, node)))
        start = node
    if not (len(output.args) == 1 and output.args[0] is start):
        stages.append((OUTPUT_STAGE, _segment(module, nodes, start, output)))
    _check(network, stages, example_input)
    return stages


def _depends_on_input(nodes: list[fx.Node]) -> set[fx.Node]:
    dependent: set[fx.Node] = set()
    for node in nodes:
        if node.op == "placeholder" or any(arg in dependent for arg in node.all_input_nodes):
            dependent.add(node)
    return dependent


def _is_cut(nodes: list[fx.Node], cut: fx.Node) -> bool:
    """True when nothing after ``cut`` uses an input-dependent value from before it other than ``cut``."""
    position = {node: i for i, node in enumerate(nodes)}
    dependent = _depends_on_input(nodes)
    for node in nodes[position[cut] + 1:]:
        for arg in node.all_input_nodes:
            if arg is not cut and arg in dependent and position[arg] < position[cut]:
                return False
    return True


def _segment(module: fx.GraphModule, nodes: list[fx.Node], start: fx.Node | None, stop: fx.Node) -> nn.Module:
    """A GraphModule computing ``stop`` (a node, or the graph's output) from ``start``'s value (or from
    the network's input if None); constants and parameters it needs are copied in."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    position = {node: i for i, node in enumerate(nodes)}
    first = 0 if start is None else position[start] + 1
    if start is not None:
        env[start] = graph.placeholder("x")

    def copy(node: fx.Node) -> fx.Node:
        if node not in env:
            for arg in node.all_input_nodes:
                copy(arg)
            env[node] = graph.node_copy(node, lambda n: env[n])
        return env[node]

    for node in nodes[first:position[stop] + 1]:
        if node.op == "output":
            graph.output(fx.map_arg(node.args[0], lambda n: copy(n)))
        else:
            copy(node)
    if stop.op != "output":
        graph.output(env[stop])
    return fx.GraphModule(module, graph)


def _check(network: nn.Module, stages, example_input: torch.Tensor) -> None:
    was_training = network.training
    network.eval()
    name = type(network).__name__
    try:
        with torch.no_grad():
            expected = network(example_input)
            x = example_input
            for _, stage in stages:
                x = stage(x)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:  # the network's own code refused the input
        shape = " × ".join(map(str, example_input.shape[1:]))
        raise ConfigError(f"{name}: its forward pass fails on images of {shape} (channels × height × width, as the "
                          f"model's preprocessing gives them: channels and size_px) with {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}; give the preprocessing the input the "
                          "network takes") from None
    finally:
        network.train(was_training)
    if not isinstance(expected, torch.Tensor):
        raise ConfigError(f"{name}: its forward pass returns {type(expected).__name__}; stimsim needs one tensor "
                          "(the network's output, e.g. its class scores)")
    if not torch.isfinite(expected).all():
        raise ConfigError(f"{name}: its forward pass gives values that are not finite (NaN or infinity) on an "
                          "all-zero input; check its weights")
    if not isinstance(x, torch.Tensor) or x.shape != expected.shape or not torch.allclose(
            x, expected, atol=1e-5, rtol=1e-4):
        raise ConfigError(f"{name}: running its stages in order does not reproduce its forward "
                          f"pass; stages: {[name for name, _ in stages]}")

"""Moving layers between stage replicas: their modules, parameters and optimizer state (no Ray).

What a ``LayerMove`` (``pdml_ray.pipeline.rebalance``) needs of a stage replica (``StageWorker``): copies of
the layers it gives up, each parameter's optimizer state with them (``export_layers``), and the stage
rebuilt without those layers and with its neighbours' (``move_layers``). The optimizer is rebuilt over
the new parameters by the stage's optimizer factory, with the first parameter group's settings (the
learning rate a schedule may have changed) carried over, and every parameter, kept or received, keeps
its state (momentum, Adam's moments and step): the move changes placement, not the update.

Between steps only: a stage holding activations or gradients refuses (``PlanError``). Layers that share
a parameter with a layer staying behind (tied weights) cannot be moved apart: the copy would untie them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from pdml_ray.errors import PlanError

LayerPayload = tuple[list[nn.Module], list[dict[str, Any]]]
"""Layers in model order and, per parameter of theirs (``parameters()`` order), its optimizer state."""


def _state_copy(optimizer: torch.optim.Optimizer, p: nn.Parameter) -> dict[str, Any]:
    return {k: v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v) for k, v in optimizer.state.get(p, {}).items()}


def export_layers(module: nn.Module, optimizer: torch.optim.Optimizer, front: int, back: int
                  ) -> tuple[LayerPayload | None, LayerPayload | None]:
    """Copies of the first ``front`` and last ``back`` layers of ``module`` with their optimizer state
    (None where the count is 0); the stage is unchanged."""
    layers = list(module.children())  # a stage is an nn.Sequential: its layers in order
    if front < 0 or back < 0 or front + back >= len(layers):
        raise PlanError(f"a stage of {len(layers)} layers cannot give {front} from its front and {back} from its back: "
                        "a stage keeps at least one layer")

    def payload(part: list[nn.Module]) -> LayerPayload:
        params = [p for layer in part for p in layer.parameters()]
        return copy.deepcopy(part), [_state_copy(optimizer, p) for p in params]

    return (payload(layers[:front]) if front else None, payload(layers[len(layers) - back:]) if back else None)


def move_layers(module: nn.Module, optimizer: torch.optim.Optimizer,
                factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer], *, drop_front: int, drop_back: int,
                add_front: LayerPayload | None, add_back: LayerPayload | None
                ) -> tuple[nn.Sequential, torch.optim.Optimizer]:
    """``module`` without its first ``drop_front`` and last ``drop_back`` layers, with ``add_front``'s layers
    before and ``add_back``'s after, and an optimizer over its parameters in which every parameter keeps
    its state."""
    layers = list(module.children())  # a stage is an nn.Sequential: its layers in order
    if drop_front < 0 or drop_back < 0 or drop_front + drop_back > len(layers):
        raise PlanError(f"a stage of {len(layers)} layers cannot drop {drop_front} from its front and {drop_back} "
                        "from its back")
    if any(p.grad is not None for p in module.parameters()):
        raise PlanError("layers move between steps: this stage holds gradients of an unfinished step")
    kept = layers[drop_front:len(layers) - drop_back]
    kept_ids = {id(p) for layer in kept for p in layer.parameters()}
    dropped = layers[:drop_front] + layers[len(layers) - drop_back:]
    if any(id(p) in kept_ids for layer in dropped for p in layer.parameters()):
        raise PlanError("a moving layer shares a parameter with a layer that stays (tied weights); cut elsewhere")
    state = {id(p): optimizer.state[p] for layer in kept for p in layer.parameters() if p in optimizer.state}
    received: dict[int, dict[str, Any]] = {}
    front: list[nn.Module] = []
    back: list[nn.Module] = []
    for payload, into in ((add_front, front), (add_back, back)):
        if payload is None:
            continue
        new_layers, states = payload
        params = [p for layer in new_layers for p in layer.parameters()]
        if len(states) != len(params):
            raise PlanError(f"moved layers carry {len(params)} parameters but {len(states)} optimizer states")
        received.update({id(p): s for p, s in zip(params, states) if s})
        into.extend(new_layers)
    if not front + kept + back:
        raise PlanError("a stage must keep at least one layer")
    new_module = nn.Sequential(*front, *kept, *back)
    new_optimizer = factory(new_module.parameters())
    if len(optimizer.param_groups) == len(new_optimizer.param_groups) == 1:
        new_optimizer.param_groups[0].update({k: v for k, v in optimizer.param_groups[0].items() if k != "params"})
    for p in new_module.parameters():
        saved = state.get(id(p)) or received.get(id(p))
        if saved:
            new_optimizer.state[p] = {k: v.to(p.device) if torch.is_tensor(v) else v for k, v in saved.items()}
    return new_module, new_optimizer

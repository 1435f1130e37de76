"""Gradients and parameters cut into slices, each tagged with its layer's priority in forward order.

P3 (Jayarajan et al., 2019) synchronises at a finer granularity than the model's layers: every
layer's flattened parameters are cut into slices of at most ``slice_elements`` elements, and a slice
carries the priority of its layer. The first layer the next forward pass needs has priority 0, the
highest; the last layer has priority ``L - 1``. Slices never cross a layer boundary, so a layer's
priority is exact for every element it owns.

A ``SlicePlan`` is data: frozen, printable, validated. Every element of every layer lies in exactly
one slice, and ``cut`` / ``reassemble`` are exact inverses (slices are views of contiguous ranges).
The same plan drives the simulator (``simulate``), the all-reduce runtime (``pdml_ray.train.p3_sync``)
and the parameter-server runtime (phase 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdml_ray.errors import ConfigError, PlanError


@dataclass(frozen=True, slots=True)
class Slice:
    """Elements ``[start, stop)`` of layer ``layer``'s flattened parameters."""

    index: int  # position in the plan (forward order of layers, then offset)
    layer: int  # layer index in forward order
    priority: int  # 0 = needed first by the next forward pass (= the layer index)
    start: int  # element offset in the layer's flat vector
    stop: int
    nbytes: int  # (stop - start) x element size

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class SlicePlan:
    """All slices of a model, in forward order (layer 0's slices first)."""

    layer_numels: tuple[int, ...]  # elements per layer, forward order
    slice_elements: int  # the most elements one slice holds
    element_size: int  # bytes per element (4 for float32)
    slices: tuple[Slice, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layer_numels)

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_numels) * self.element_size

    def layer_bytes(self, layer: int) -> int:
        return self.layer_numels[layer] * self.element_size

    def slices_of(self, layer: int) -> tuple[Slice, ...]:
        """The slices of one layer, in offset order."""
        return tuple(s for s in self.slices if s.layer == layer)

    def validate(self) -> None:
        """Every element of every layer in exactly one slice; indices, priorities and sizes consistent."""
        expect = 0
        for i, s in enumerate(self.slices):
            if s.index != i:
                raise PlanError(f"slice {i} has index {s.index}: slices must be numbered in plan order")
            if s.priority != s.layer or not 0 <= s.layer < self.num_layers:
                raise PlanError(f"slice {i}: layer {s.layer} / priority {s.priority} out of order")
            if not 0 < s.numel <= self.slice_elements or s.nbytes != s.numel * self.element_size:
                raise PlanError(f"slice {i}: size {s.numel} elements / {s.nbytes} bytes does not fit "
                                f"slice_elements={self.slice_elements}, element_size={self.element_size}")
        for layer, numel in enumerate(self.layer_numels):
            expect = 0
            for s in self.slices_of(layer):
                if s.start != expect:
                    raise PlanError(f"layer {layer}: slice {s.index} starts at {s.start}, expected {expect} "
                                    "(a gap or an overlap)")
                expect = s.stop
            if expect != numel:
                raise PlanError(f"layer {layer}: slices cover {expect} of its {numel} elements")

    def __str__(self) -> str:
        rows = [f"SlicePlan: {len(self.slices)} slices of <= {self.slice_elements} elements over "
                f"{self.num_layers} layers ({self.total_bytes / 1e6:.2f} MB)"]
        for layer, numel in enumerate(self.layer_numels):
            rows.append(f"  layer {layer:3d}  priority {layer:3d}  {numel:>12,d} elements  "
                        f"{len(self.slices_of(layer)):5d} slices")
        return "\n".join(rows)


def plan_slices(layer_numels: Sequence[int], slice_elements: int, element_size: int = 4) -> SlicePlan:
    """Cut layers (element counts in forward order) into slices of at most ``slice_elements``.

    A layer of n elements gives ``ceil(n / slice_elements)`` slices, all full but the last; a layer
    without elements gives none (it has nothing to send).
    """
    if not isinstance(slice_elements, int) or isinstance(slice_elements, bool) or slice_elements < 1:
        raise ConfigError(f"slice_elements must be an integer >= 1 (P3 uses 40000), got {slice_elements!r}")
    if element_size < 1:
        raise ConfigError(f"element_size must be >= 1 byte, got {element_size!r}")
    numels = tuple(int(n) for n in layer_numels)
    if any(n < 0 for n in numels):
        raise ConfigError(f"layer sizes must be >= 0 elements, got {list(numels)}")
    slices: list[Slice] = []
    for layer, numel in enumerate(numels):
        for start in range(0, numel, slice_elements):
            stop = min(numel, start + slice_elements)
            slices.append(Slice(len(slices), layer, layer, start, stop, (stop - start) * element_size))
    return SlicePlan(numels, slice_elements, element_size, tuple(slices))


def flatten_layer(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One layer's tensors (its parameters or their gradients) as one flat vector (a copy)."""
    if not tensors:
        return torch.zeros(0)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unflatten_layer(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The inverse of ``flatten_layer``: views of ``flat`` shaped like ``like``."""
    total = sum(t.numel() for t in like)
    if total != flat.numel():
        raise PlanError(f"a flat layer of {flat.numel()} elements does not match tensors of {total} elements")
    out, offset = [], 0
    for t in like:
        out.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return out


def cut(plan: SlicePlan, layer_flats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each slice of the plan as a view into its layer's flat vector (in plan order)."""
    if len(layer_flats) != plan.num_layers:
        raise PlanError(f"the plan has {plan.num_layers} layers, got {len(layer_flats)} flat vectors")
    for layer, (flat, numel) in enumerate(zip(layer_flats, plan.layer_numels)):
        if flat.dim() != 1 or flat.numel() != numel:
            raise PlanError(f"layer {layer}: expected a flat vector of {numel} elements, got shape {tuple(flat.shape)}")
    return [layer_flats[s.layer][s.start:s.stop] for s in plan.slices]


def reassemble(plan: SlicePlan, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Layers' flat vectors from the plan's slices (any order of arrival: ``parts[i]`` is slice i)."""
    if len(parts) != len(plan.slices):
        raise PlanError(f"the plan has {len(plan.slices)} slices, got {len(parts)} parts")
    dtype = parts[0].dtype if parts else torch.float32
    layers = [torch.empty(n, dtype=dtype) for n in plan.layer_numels]
    for s, part in zip(plan.slices, parts):
        if part.numel() != s.numel:
            raise PlanError(f"slice {s.index} must hold {s.numel} elements, got {part.numel()}")
        layers[s.layer][s.start:s.stop] = part.reshape(-1)
    return layers

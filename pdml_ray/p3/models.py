"""Layer-size and compute lists of real models for the P3 simulator: VGG-19, ResNet-50, a GPT-style
block stack. Hand-written from the architectures (torchvision is not a dependency); the parameter
totals match torchvision's / GPT-2's (143,667,240 for VGG-19, 25,557,032 for ResNet-50, 124,439,808
for GPT-2 small with a tied head), which the unit tests check.

Compute times are MODELLED, not measured: forward FLOPs per layer (2 x multiply-adds) x batch /
``flops_per_s``, backward = 2 x forward. Only their proportions matter to the comm/compute ratios
the simulator sweeps; pass measured times to ``ModelProfile`` for a real cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdml_ray.errors import ConfigError

DEFAULT_FLOPS_PER_S = 15e12  # an effective 15 TFLOP/s: a V100-class accelerator in fp32/tf32


@dataclass(frozen=True, slots=True)
class LayerProfile:
    """One layer: its parameters (elements) and its compute (seconds)."""

    name: str
    numel: int
    forward_s: float
    backward_s: float


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """A model's layers in forward order."""

    name: str
    layers: tuple[LayerProfile, ...]
    element_size: int = 4

    def __post_init__(self) -> None:
        if not self.layers:
            raise ConfigError(f"model profile {self.name!r} has no layers")
        for layer in self.layers:
            if layer.numel < 0 or layer.forward_s < 0 or layer.backward_s < 0:
                raise ConfigError(f"{self.name}: layer {layer.name!r} needs numel >= 0 and times >= 0, got {layer}")

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(layer.numel for layer in self.layers)

    @property
    def total_numel(self) -> int:
        return sum(self.numels)

    @property
    def total_bytes(self) -> int:
        return self.total_numel * self.element_size

    @property
    def compute_s(self) -> float:
        return sum(layer.forward_s + layer.backward_s for layer in self.layers)


def from_flops(name: str, layers: list[tuple[str, int, float]], batch: int,
               flops_per_s: float = DEFAULT_FLOPS_PER_S) -> ModelProfile:
    """(layer name, parameters, forward FLOPs per sample) -> a profile (backward = 2 x forward)."""
    out = []
    for layer_name, numel, flops in layers:
        fwd = flops * batch / flops_per_s
        out.append(LayerProfile(layer_name, numel, fwd, 2 * fwd))
    return ModelProfile(name, tuple(out))


def _conv(name: str, cin: int, cout: int, k: int, hw_out: int, bias: bool, bn: bool) -> tuple[str, int, float]:
    numel = cin * cout * k * k + (cout if bias else 0) + (2 * cout if bn else 0)
    return name, numel, 2.0 * cin * cout * k * k * hw_out * hw_out


def vgg19_layers() -> list[tuple[str, int, float]]:
    """VGG-19 (configuration E) at 224x224: 16 convolutions, 3 fully connected layers."""
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]
    layers: list[tuple[str, int, float]] = []
    cin, hw = 3, 224
    for c in cfg:
        if c == "M":
            hw //= 2
            continue
        assert isinstance(c, int)
        layers.append(_conv(f"conv{len(layers) + 1}", cin, c, 3, hw, bias=True, bn=False))
        cin = c
    for i, (fin, fout) in enumerate([(512 * 7 * 7, 4096), (4096, 4096), (4096, 1000)]):
        layers.append((f"fc{6 + i}", fin * fout + fout, 2.0 * fin * fout))
    return layers


def resnet50_layers() -> list[tuple[str, int, float]]:
    """ResNet-50 (v1.5: stride on the 3x3) at 224x224; each convolution with its batch norm is a layer."""
    layers = [_conv("conv1", 3, 64, 7, 112, bias=False, bn=True)]
    cin, hw = 64, 56
    for stage, (width, blocks) in enumerate(zip([64, 128, 256, 512], [3, 4, 6, 3])):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            out_hw = hw // stride
            prefix = f"layer{stage + 1}.{block}"
            layers.append(_conv(f"{prefix}.conv1", cin, width, 1, hw, bias=False, bn=True))
            layers.append(_conv(f"{prefix}.conv2", width, width, 3, out_hw, bias=False, bn=True))
            layers.append(_conv(f"{prefix}.conv3", width, 4 * width, 1, out_hw, bias=False, bn=True))
            if block == 0:
                layers.append(_conv(f"{prefix}.downsample", cin, 4 * width, 1, out_hw, bias=False, bn=True))
            cin, hw = 4 * width, out_hw
    layers.append(("fc", 2048 * 1000 + 1000, 2.0 * 2048 * 1000))
    return layers


def gpt_layers(n_layer: int = 12, d_model: int = 768, seq: int = 1024,
               vocab: int = 50257) -> list[tuple[str, int, float]]:
    """A GPT-2-style stack (per sample = one sequence of ``seq`` tokens); the output head is tied to the
    token embedding, so its weights are layer 0's (needed first) and its compute is the last layer's."""
    d = d_model
    block = 12 * d * d + 13 * d  # ln1, qkv, proj, ln2, mlp fc, mlp proj (weights and biases)
    block_flops = seq * (24.0 * d * d + 4.0 * seq * d)  # matmuls + attention scores and values
    layers = [("embedding", vocab * d + seq * d, 0.0)]
    layers += [(f"block{i}", block, block_flops) for i in range(n_layer)]
    layers.append(("ln_f", 2 * d, 0.0))
    layers.append(("lm_head (tied)", 0, 2.0 * seq * d * vocab))
    return layers


def vgg19(batch: int = 32, flops_per_s: float = DEFAULT_FLOPS_PER_S) -> ModelProfile:
    return from_flops("vgg19", vgg19_layers(), batch, flops_per_s)


def resnet50(batch: int = 32, flops_per_s: float = DEFAULT_FLOPS_PER_S) -> ModelProfile:
    return from_flops("resnet50", resnet50_layers(), batch, flops_per_s)


def gpt(batch: int = 8, flops_per_s: float = DEFAULT_FLOPS_PER_S, **shape: int) -> ModelProfile:
    return from_flops("gpt", gpt_layers(**shape), batch, flops_per_s)


MODELS = {"vgg19": vgg19, "resnet50": resnet50, "gpt": gpt}


def model_profile(name: str) -> ModelProfile:
    """A profile by name (``MODELS``), at its default batch."""
    if name not in MODELS:
        raise ConfigError(f"unknown model profile {name!r}; valid names: {sorted(MODELS)}")
    return MODELS[name]()

"""P3, priority-based parameter propagation (Jayarajan et al., 2019): gradients cut into slices and
sent in the order the next forward pass needs them. Ray-free core, shared by the simulator, the
all-reduce runtime (``pdml_ray.train.p3_sync``) and the parameter-server runtime.

    slicing.py   SlicePlan: layers cut into slices, priority = layer index in forward order
    queue.py     send queues by name (p3 / fifo / layer-fifo / bucketed), preemption, the credit window
    link.py      LinkModel (bandwidth, latency, per-message overhead), EmulatedLink (wall clock)
    simulate.py  one iteration as discrete events; send_order for fixed collective orders
    sweep.py     P3 / FIFO / per-layer FIFO / bucketed over comm/compute ratios (python -m pdml_ray.p3.sweep)
    models.py    layer lists of VGG-19, ResNet-50, a GPT-style stack
    auto.py      slice size and credit from the measured link (rule, then a simulated search)
    ps.py        the parameter-server runtime's workers (hooks, EMULATED links)
    shard.py     its shards (sliced SGD) and how workers reach them

``python -m pdml_ray.p3.sweep`` prints P3 / FIFO / bucketed iteration times (bandwidth EMULATED).
"""

from pdml_ray.p3.auto import AutoChoice, tune
from pdml_ray.p3.link import EMULATION_NOTE, EmulatedLink, Link, LinkModel
from pdml_ray.p3.models import LayerProfile, ModelProfile, model_profile
from pdml_ray.p3.queue import QUEUES, Message, SendQueue, make_queue
from pdml_ray.p3.simulate import IterationResult, send_order, simulate_iteration
from pdml_ray.p3.slicing import Slice, SlicePlan, cut, plan_slices, reassemble

__all__ = ["EMULATION_NOTE", "QUEUES", "AutoChoice", "EmulatedLink", "IterationResult", "LayerProfile", "Link",
           "LinkModel", "Message", "ModelProfile", "SGDSettings", "SendQueue", "Slice", "SlicePlan", "cut", "make_queue",
           "model_profile", "plan_slices", "reassemble", "send_order", "simulate_iteration", "tune"]


def __getattr__(name: str) -> object:
    """``SGDSettings`` lives with the shards, which need torch: imported on first use, so validating a
    ``P3Config`` (which reads ``QUEUES``) stays free of torch."""
    if name == "SGDSettings":
        from pdml_ray.p3.shard import SGDSettings

        return SGDSettings
    raise AttributeError(f"module 'pdml_ray.p3' has no attribute {name!r}")

"""The P3 parameter-server runtime's core without Ray: shards (round-robin slices, sliced SGD) and P3 workers in threads over
``LocalShardTransport`` train the same parameters as single-process SGD on the same global batches, under
every send policy; an EMULATED slow link makes P3's forward of layer 0 start before the last update
arrives."""

import threading
from concurrent.futures import Future

import pytest
import torch
import torch.nn.functional as F

from pdml_ray.errors import PlanError
from pdml_ray.p3.link import LinkModel
from pdml_ray.p3.ps import P3PSWorker, layer_plan, model_layers
from pdml_ray.p3.shard import LocalShardTransport, SGDSettings, ShardState, shard_of
from pdml_ray.p3.slicing import flatten_layer, reassemble

STEPS, SIZES = 5, (20, 12)  # global batch 32, unequal shares


def small_model() -> torch.nn.Module:
    torch.manual_seed(4)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 3))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS * sum(SIZES), 8, generator=g), torch.randint(0, 3, (STEPS * sum(SIZES),), generator=g)


def batches(worker: int):
    total, offset = sum(SIZES), sum(SIZES[:worker])
    return [(k * total + offset, SIZES[worker], SIZES[worker] / total) for k in range(STEPS)]


def train_ps(policy: str, num_shards: int, link: LinkModel | None = None, answer_delay_s: float = 0.0, **kwargs):
    x, y = data()
    sgd = SGDSettings(lr=0.1, momentum=0.9, weight_decay=1e-3)
    plan = layer_plan(small_model(), 300)
    layers = [flatten_layer(ps) for _, _, ps in model_layers(small_model())]
    shards = [ShardState(s, num_shards, plan, layers, len(SIZES), sgd) for s in range(num_shards)]
    transport = LocalShardTransport(shards) if not answer_delay_s else SlowTransport(LocalShardTransport(shards), answer_delay_s)
    workers = [P3PSWorker(w, small_model(), F.cross_entropy, x, y, batches(w), transport, num_shards, policy=policy,
                          slice_elements=300, bucket_bytes=2000, link=link, **kwargs) for w in range(len(SIZES))]
    runs = [None, None]

    def go(w):
        runs[w] = workers[w].train()

    threads = [threading.Thread(target=go, args=(w,)) for w in range(len(SIZES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None for r in runs)
    return workers, shards, runs


class SlowTransport:
    """``LocalShardTransport`` whose answers (the updated slices) come back ``delay_s`` late, as a slow Ray
    round trip would."""

    def __init__(self, inner: LocalShardTransport, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def push(self, shard, step, worker, slice_ids, grads):
        out: Future = Future()

        def later(done: Future) -> None:
            threading.Timer(self.delay_s, out.set_result, args=(done.result(),)).start()

        self.inner.push(shard, step, worker, slice_ids, grads).add_done_callback(later)
        return out


def reference() -> torch.Tensor:
    x, y = data()
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    for k in range(STEPS):
        rows = slice(k * sum(SIZES), (k + 1) * sum(SIZES))
        opt.zero_grad()
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("policy", ["p3", "fifo", "layer-fifo", "bucketed"])
def test_every_policy_trains_the_single_process_parameters(policy):
    workers, shards, _ = train_ps(policy, num_shards=2)
    want = reference()
    for w in workers:
        assert (w.parameters_vector() - want).abs().max().item() < 1e-5
    assert sum(s.updates for s in shards) == STEPS * len(workers[0].plan.slices)
    # round-robin: each shard holds every other slice
    assert [s.index for s in shards[1].slices] == [i for i in range(len(workers[0].plan.slices)) if shard_of(i, 2) == 1]


@pytest.mark.parametrize("transfer", ["layer", "message"])
@pytest.mark.parametrize("credit_slices", [None, 3])
def test_every_window_and_transfer_trains_the_single_process_parameters(transfer, credit_slices):
    link = LinkModel(bandwidth_Bps=2e7)  # EMULATED: several messages on the modelled wire at once with a window
    credit = credit_slices * 1200 if credit_slices else None
    workers, _, runs = train_ps("p3", num_shards=2, link=link, credit_bytes=credit, transfer=transfer)
    want = reference()
    for w in workers:
        assert (w.parameters_vector() - want).abs().max().item() < 1e-5
    sent = [t for kind, s, i, t in runs[0].timeline if kind == "sent" and s == 1]
    assert len(sent) == len(workers[0].plan.slices)  # every slice of a step went through the EMULATED uplink


def test_the_window_bounds_the_bytes_on_the_emulated_link():
    # 4.8 ms per 1.2 KB slice, EMULATED: a backlog builds up behind the window even when a loaded or
    # slow machine stalls the backward (at 1.2 ms per slice one CI run saw a single slice in flight)
    link = LinkModel(bandwidth_Bps=2.5e5)
    workers, _, _ = train_ps("p3", num_shards=2, link=link, credit_bytes=2 * 1200)
    for w in workers:  # the last round's queues: never more than the window in flight (a lone message may exceed it)
        assert 1200 < w._up.max_in_flight_bytes <= 2 * 1200 and 0 < w._down.max_in_flight_bytes <= 2 * 1200


def test_p3_first_layer_forward_starts_before_the_last_update_arrives():
    # ~4.8 ms per 1.2 KB slice, EMULATED: slow enough that a backlog of later layers' slices builds up
    # behind layer 0's even when a loaded machine slows compute 3x (at 0.6 ms per slice it did not)
    link = LinkModel(bandwidth_Bps=2.5e5)
    _, _, runs = train_ps("p3", num_shards=3, link=link)
    overlapped = 0
    for step in range(1, STEPS):
        forward0 = min(t for kind, s, i, t in runs[0].timeline if kind == "forward" and s == step and i == 0)
        last = max(t for kind, s, i, t in runs[0].timeline if kind == "arrived" and s == step - 1)
        overlapped += forward0 < last
    assert overlapped >= STEPS - 2


def test_the_real_answer_travels_during_the_emulated_download_not_before_it():
    """A slice counts as arrived when the EMULATED downlink says so or when the shard's real answer is
    back, whichever is later; the modelled download is not started only after the real answer (that
    counted the transfer twice). Answers 100 ms late, 20 ms per slice on the EMULATED link: the first
    slice of each round is through the modelled downlink long before its answer, so it arrives the
    moment the answer does (waiting for the answer first would make it arrive 20 ms after it)."""
    link = LinkModel(bandwidth_Bps=6e4)  # 20 ms per 1.2 KB slice, EMULATED
    _, _, runs = train_ps("fifo", num_shards=2, link=link, answer_delay_s=0.1)
    for run in runs:
        for step in range(STEPS):
            pulled = {i: t for kind, s, i, t in run.timeline if kind == "pulled" and s == step}
            arrived = {i: t for kind, s, i, t in run.timeline if kind == "arrived" and s == step}
            assert set(arrived) == set(pulled) and pulled, (step, pulled, arrived)
            assert all(arrived[i] >= pulled[i] for i in arrived)  # never before the real value is here
            assert min(arrived[i] - pulled[i] for i in arrived) == 0.0, (step, pulled, arrived)


def test_a_shard_refuses_a_double_push_and_a_foreign_slice():
    plan = layer_plan(small_model(), 300)
    layers = [flatten_layer(ps) for _, _, ps in model_layers(small_model())]
    shard = ShardState(0, 2, plan, layers, 2, SGDSettings(lr=0.1))
    assert shard.push(0, 0, [0], [torch.zeros(plan.slices[0].numel)]) == []
    with pytest.raises(PlanError, match="twice"):
        shard.push(0, 0, [0], [torch.zeros(plan.slices[0].numel)])
    with pytest.raises(PlanError, match="does not hold"):
        shard.push(0, 1, [1], [torch.zeros(plan.slices[1].numel)])
    assert shard.push(0, 1, [0], [torch.ones(plan.slices[0].numel)]) == [0]


@pytest.mark.parametrize("policy", ["p3", "bucketed"])
def test_a_run_re_sliced_between_segments_keeps_the_single_process_parameters(policy):
    """What the runtime does at a decision boundary: workers train a segment with their links open, the
    shards are rebuilt on a new slicing from their values and SGD momentum, the workers re-plan, and the
    rest of the run trains the parameters of one uninterrupted SGD (momentum 0.9)."""
    x, y = data()
    sgd = SGDSettings(lr=0.1, momentum=0.9, weight_decay=1e-3)
    plan = layer_plan(small_model(), 300)
    layers = [flatten_layer(ps) for _, _, ps in model_layers(small_model())]
    transport = LocalShardTransport([ShardState(s, 2, plan, layers, len(SIZES), sgd) for s in range(2)])
    workers = [P3PSWorker(w, small_model(), F.cross_entropy, x, y, batches(w), transport, 2, policy=policy,
                          slice_elements=300, bucket_bytes=2000, link=LinkModel(bandwidth_Bps=2e7), credit_bytes=2400)
               for w in range(len(SIZES))]

    def segment(first: int, stop: int, close: bool) -> list:
        links = [None] * len(workers)

        def go(w: int) -> None:
            workers[w].train(first, stop, close=close)
            links[w] = workers[w].link_measurement(first, stop)

        threads = [threading.Thread(target=go, args=(w,)) for w in range(len(workers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return links

    links = segment(0, 2, close=False)
    assert links == [(2e7, 0.0, 0.0)] * 2  # the EMULATED link's own figures
    values = {i: v for shard in transport.shards for i, v in ((i, shard.value(i)) for i in shard.values)}
    momentum = {i: m for shard in transport.shards for i, m in shard.momentum().items()}
    assert len(momentum) == len(plan.slices)  # every slice was updated: every slice has its buffer
    new_plan = layer_plan(small_model(), 128)
    transport.shards = [ShardState(s, 2, new_plan, reassemble(plan, [values[i] for i in range(len(plan.slices))]),
                                   len(SIZES), sgd, reassemble(plan, [momentum[i] for i in range(len(plan.slices))]))
                        for s in range(2)]
    for w in workers:
        w.replan(128, 2 * 128 * 4)
    segment(2, STEPS, close=True)
    want = reference()
    for w in workers:
        assert w.plan.slice_elements == 128 and len(w.plan.slices) == len(new_plan.slices) > len(plan.slices)
        assert (w.parameters_vector() - want).abs().max().item() < 1e-5
    assert len(workers[0].run.step_starts) == STEPS


def test_without_an_emulated_link_the_measured_bandwidth_is_a_step_s_bytes_over_its_push_to_pull_span():
    workers, _, runs = train_ps("fifo", num_shards=2, answer_delay_s=0.05)  # every answer >= 50 ms late
    bandwidth, latency, overhead = workers[0].link_measurement(0, STEPS)
    assert (latency, overhead) == (0.0, 0.0)  # not measured
    # the span of a step is at least the answers' 50 ms: the rate at most the step's bytes over that
    assert 0 < bandwidth <= workers[0].plan.total_bytes / 0.05
    assert workers[0].link_measurement(STEPS, STEPS) is None  # no step: nothing measured

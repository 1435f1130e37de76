"""Step timing on a real GPU: compute_s (CUDA events on the compute stream, read a step late) holds the
step's own compute and not the collective that follows it on another stream, which the old
measurement (torch.cuda.synchronize, then wall time) includes. Skipped where no GPU is visible.

One GPU: a long spinning kernel on a side stream (torch.cuda._sleep: one thread, it takes no compute
from the matmuls) stands for the all-reduce and the wait for a slower rank. Two GPUs or more: two NCCL
ranks, rank 1 three times slower, a real async all_reduce after the compute."""

import json
import socket
import time

import pytest
import torch
import torch.distributed as dist

from pdml_ray.train.timing import CudaEventTimer, make_timer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TARGET_COMPUTE_S = 0.03  # each rank's step compute, calibrated to about this
STEPS = 4


def _operand(device):
    n = 2048
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, n, generator=g) / n ** 0.5).to(device)  # scaled: products stay near norm 1


def _compute(x, iters):
    """Stands for forward + backward: a chain of matmuls on the current (compute) stream."""
    y = x
    for _ in range(iters):
        y = y @ x
    return y


def _wall_s(fn, repeats=3):
    """Median seconds of fn() alone on an idle GPU (synchronized before and after)."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _calibrated_iters(x):
    _compute(x, 4)  # warm up cuBLAS
    iters = 4
    while iters < 4096 and _wall_s(lambda: _compute(x, iters)) < TARGET_COMPUTE_S:
        iters *= 2
    return iters


def _sleep_cycles(seconds):
    """Cycles for torch.cuda._sleep to spin about ``seconds``."""
    probe = 10_000_000
    return int(probe * seconds / _wall_s(lambda: torch.cuda._sleep(probe)))


def _close(measured, expected):
    return abs(measured - expected) <= 0.25 * expected + 0.002


def test_compute_s_excludes_a_collective_on_another_stream_which_synchronize_includes():
    dev = torch.device("cuda", torch.cuda.current_device())
    x = _operand(dev)
    iters = _calibrated_iters(x)
    half = iters // 2
    compute_only = _wall_s(lambda: (_compute(x, half), _compute(x, iters - half)))
    cycles = _sleep_cycles(max(5 * compute_only, 0.1))
    side_alone = _wall_s(lambda: torch.cuda._sleep(cycles), repeats=1)
    assert side_alone > 3 * compute_only
    compute_stream = torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(dev)

    def backward():  # the side stream's "all-reduce" starts in the middle, as DDP's early buckets do
        _compute(x, half)
        side.wait_stream(compute_stream)  # a collective starts once its gradients exist
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)  # the all-reduce, and waiting for a slower rank
        _compute(x, iters - half)  # the rest of backward, beside it

    timer = make_timer(dev)
    assert isinstance(timer, CudaEventTimer)
    got, arrived_at, old = [], {}, []
    for step in range(STEPS):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        timer.begin(step)
        backward()
        timer.end()  # compute ended (DDP: the last bucket), before the compute stream waits below
        compute_stream.wait_stream(side)  # work.wait() / the end of DDP's backward
        _compute(x, 1)  # the optimizer step, on the combined gradients
        t = time.perf_counter()
        new = timer.collect()
        assert time.perf_counter() - t < 0.01, "collect() waited for the GPU"
        arrived_at.update({s: step for s, _ in new})
        got += new
        torch.cuda.synchronize(dev)  # the old measurement: waits on every stream, the side one too
        old.append(time.perf_counter() - t0)
    final = timer.collect(block=True)
    arrived_at.update({s: STEPS for s, _ in final})
    got += final

    assert [s for s, _ in got] == list(range(STEPS))
    assert arrived_at == {s: s + 1 for s in range(STEPS)}  # a step late: its compute was still running
    for (s, compute_s), old_s in zip(got, old):
        detail = f"step {s}: compute_s {compute_s:.4f}, compute alone {compute_only:.4f}, " \
                 f"side kernel {side_alone:.4f}, synchronize-based {old_s:.4f}"
        assert _close(compute_s, compute_only), detail
        assert compute_s < 0.5 * side_alone, detail
        assert old_s > compute_s + 0.5 * side_alone, detail  # what the old measurement got wrong


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, port, out_dir):
    """One NCCL rank: STEPS steps of compute then an async all_reduce; rank 1 computes 3x as long."""
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        x = _operand(dev)
        base = torch.tensor([_calibrated_iters(x)], device=dev)
        dist.broadcast(base, src=0)  # the same work on both ranks, then rank 1 does three times as much
        iters = int(base.item()) * (3 if rank == 1 else 1)
        compute_only = _wall_s(lambda: _compute(x, iters))
        grad = torch.zeros(x.numel(), device=dev)
        dist.all_reduce(grad)  # warm up NCCL
        torch.cuda.synchronize(dev)
        timer = make_timer(dev)
        got, old = [], []
        for step in range(STEPS):
            dist.barrier()
            torch.cuda.synchronize(dev)  # both ranks start the step together, GPUs idle
            t0 = time.perf_counter()
            timer.begin(step)
            grad.copy_(_compute(x, iters).reshape(-1))  # the gradient
            work = dist.all_reduce(grad, async_op=True)  # on NCCL's stream, once the gradient exists
            timer.end()
            work.wait()  # the compute stream waits for the all-reduce: rank 0 for rank 1's compute too
            got += timer.collect()
            torch.cuda.synchronize(dev)  # the old measurement
            old.append(time.perf_counter() - t0)
        got += timer.collect(block=True)
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump({"compute_only": compute_only, "got": got, "old": old}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for two NCCL ranks")
def test_two_nccl_ranks_compute_s_excludes_waiting_for_the_slower_rank(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    fast, slow = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    for r in (fast, slow):
        assert [s for s, _ in r["got"]] == list(range(STEPS))
        for (s, compute_s), old_s in zip(r["got"], r["old"]):
            assert _close(compute_s, r["compute_only"]), (s, r)
    assert slow["compute_only"] > 2 * fast["compute_only"]  # rank 1 really is slower
    for (s, compute_s), old_s in zip(fast["got"], fast["old"]):
        assert compute_s < 0.6 * slow["compute_only"], (s, fast, slow)  # no wait for rank 1 in it
        assert old_s > 0.8 * slow["compute_only"], (s, fast, slow)  # the old measurement waited

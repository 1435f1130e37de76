"""Ray Data input: ``PDMLTrainer(datasets={"train": ds})`` and ``ctx.iter_torch_batches("train", epoch=e)``.

    for epoch in range(ctx.start_epoch, epochs):
        for batch in ctx.iter_torch_batches("train", epoch=epoch):   # {"column": tensor (b_i, ...)}
            with ctx.step() as step:                                  # the step those rows were cut for
                step.loss(loss_fn(model(batch["x"]), batch["y"])).backward()
            optimizer.step(); optimizer.zero_grad()

Each step, worker i trains ``b_i`` rows, with ``b_i`` the current node decision's batch size, and the
sizes change at decision boundaries. The rows are those ``ctx.epoch`` would give: the epoch's seeded
global permutation of row positions, cut into per-worker contiguous chunks of the current sizes
(``pdml_ray.batching.step_slices``), so every row is used once per epoch and every rank runs the same
number of steps. The cutting is the batch sampler's (``ctx.batch_sampler``), so decisions, resume and
sample priorities work as they do with a DataLoader.

**Why the dataset is materialised and read by row position.** Ray Train's own path,
``ray.train.get_dataset_shard`` over ``Dataset.streaming_split(n, equal=True)``, streams each worker an
equal share in an order the workers do not agree on, and a worker's share is fixed when the split is
made: it cannot hand worker i ``b_i`` rows at step s and a different ``b_i`` at step s + 1, nor keep
the global order that makes every row used once when the sizes change. Splitting anew per decision
would restart the stream, and ``random_shuffle`` per epoch shuffles differently from the permutation
the rest of pdml-ray (and a resumed run's position) uses. So ``fit()`` runs the dataset's pipeline
once on the driver (``Dataset.materialize()``: its blocks stay in Ray's object store for the run), and
every worker maps those blocks zero-copy from its node's object store (``ray.get`` of Arrow blocks) and
takes each step's rows by global position (Ray Data's ``BlockAccessor.take``). The price: the dataset
must fit in the object store, and a node holds every block its workers read (one copy per node, shared
by its workers). Datasets too large for that want ``get_dataset_shard`` with equal shares.

**Prefetching** follows Ray Data's ``iter_torch_batches(prefetch_batches=P)``: P batches are taken and
collated (Ray Data's own ``DefaultCollateFn``, or the given ``collate_fn``) in background threads
while the step trains; the batch sampler's ``lead_steps`` is P + 1, so a decision takes effect P + 1
steps after the boundary that adopts it, on every rank alike. ``PDMLTrainer`` still hands the
materialised datasets to ``TorchTrainer``, so ``ray.train.get_dataset_shard`` works as with
``TorchTrainer`` (equal shards, pdml-ray's sizes not applied).

The blocks are found through ``Dataset.iter_internal_ref_bundles`` (a Ray DeveloperAPI: each bundle's
block refs and row slices) and joined with Ray's own ``transform_pyarrow.concat`` (internal; it handles
Ray's tensor columns), as Ray 2.60 lays them out: a change there fails ``tests/ray/test_ray_data_ray.py``.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray
import torch

from pdml_ray.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow

    from pdml_ray.train.context import PDMLContext


@dataclass(frozen=True)
class DatasetBlocks:
    """A materialised dataset as the workers receive it: its blocks' object refs, in row order."""

    name: str
    refs: tuple[Any, ...]
    """``ObjectRef``s of the blocks (Arrow tables or pandas frames), in the dataset's row order."""
    slices: tuple[tuple[int, int] | None, ...]
    """Per block, the (start, stop) rows of it that belong to the dataset; None: the whole block."""
    num_rows: int


def materialize(datasets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, DatasetBlocks]]:
    """Run each dataset's pipeline once (on the driver, before the workers start): the materialised
    datasets (for ``TorchTrainer``) and their blocks (for the workers)."""
    from ray.data import Dataset

    materialized, blocks = {}, {}
    for name, ds in datasets.items():
        if not isinstance(ds, Dataset):
            raise ConfigError(f"datasets[{name!r}] is a {type(ds).__name__}; PDMLTrainer(datasets=...) takes Ray "
                              "Datasets (ray.data.Dataset), as TorchTrainer does")
        # in order, so that a rerun resuming mid-epoch finds the rows of a deterministic pipeline at the
        # same positions (Ray Data may otherwise emit blocks as their tasks finish)
        ds = Dataset.copy(ds)
        ds.context.execution_options.preserve_order = True
        mat = ds.materialize()
        refs, slices = [], []
        for bundle in mat.iter_internal_ref_bundles():
            for ref, piece in zip(bundle.block_refs, bundle.slices):
                refs.append(ref)
                slices.append(None if piece is None else (piece.start_offset, piece.end_offset))
        materialized[name] = mat
        blocks[name] = DatasetBlocks(name, tuple(refs), tuple(slices), mat.count())
    return materialized, blocks


class DatasetRows:
    """One materialised dataset on a worker: rows by global position (0 .. num_rows - 1)."""

    def __init__(self, blocks: DatasetBlocks) -> None:
        self.blocks = blocks
        self.num_rows = blocks.num_rows
        self._table: pyarrow.Table | None = None  # the blocks as one table of many chunks (zero-copy)

    def table(self) -> pyarrow.Table:
        """The whole dataset as one Arrow table whose chunks are the blocks (fetched on first use)."""
        if self._table is None:
            from ray.data._internal.arrow_ops import transform_pyarrow
            from ray.data.block import BlockAccessor

            tables = []
            for block, piece in zip(ray.get(list(self.blocks.refs)), self.blocks.slices):
                if piece is not None:
                    block = BlockAccessor.for_block(block).slice(piece[0], piece[1], copy=False)
                tables.append(BlockAccessor.for_block(block).to_arrow())
            # Ray's concat unifies its tensor extension types, which pyarrow.concat_tables refuses
            table = transform_pyarrow.concat(tables)
            if table.num_rows != self.num_rows:
                raise ConfigError(f"dataset {self.blocks.name!r}: its blocks hold {table.num_rows} rows, its count "
                                  f"is {self.num_rows}; materialize it (ds.materialize()) before passing it")
            self._table = table
        return self._table

    def take(self, indices: list[int]) -> pyarrow.Table:
        """The rows at positions ``indices`` (b of them), in that order, as an Arrow table."""
        from ray.data.block import BlockAccessor

        return BlockAccessor.for_block(self.table()).take(indices)

    def batches(self, ctx: PDMLContext, epoch: int, *, prefetch_batches: int = 1, dtypes: Any = None,
                device: Any = "auto", collate_fn: Any = None, pin_memory: bool = False) -> Iterator[Any]:
        """This worker's batches of ``epoch``, one per step (see ``PDMLContext.iter_torch_batches``)."""
        if not (isinstance(prefetch_batches, int) and prefetch_batches >= 0):
            raise ConfigError(f"prefetch_batches must be an int >= 0, got {prefetch_batches!r}")
        collate = _collate(collate_fn, dtypes, pin_memory)
        target = ctx.device if device == "auto" else torch.device(device)  # "cuda:0" as Ray Data takes it

        def fetch(indices: list[int]) -> Any:
            from ray.data.collate_fn import is_tensor_batch_type
            from ray.data.util.torch_utils import move_tensors_to_device

            batch = collate(self.take(indices))
            return move_tensors_to_device(batch, device=target) if is_tensor_batch_type(batch) else batch

        # The sampler is iterated here, in the loop's thread, so the context's state is only ever touched
        # by that thread; the threads only take rows and collate. At step s the sampler cuts step s + P,
        # within the horizon that lead_steps = P + 1 guarantees (decisions settled that far ahead).
        steps = iter(ctx.batch_sampler(epoch, self.num_rows, lead_steps=prefetch_batches + 1))
        pending: collections.deque[concurrent.futures.Future] = collections.deque()
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(prefetch_batches, 4)),
                                                   thread_name_prefix="pdml-ray-data") as pool:
            while True:
                while len(pending) <= prefetch_batches:  # this step's batch and P ahead
                    indices = next(steps, None)
                    if indices is None:
                        break
                    pending.append(pool.submit(fetch, indices))
                if not pending:
                    return
                yield pending.popleft().result()


def _collate(collate_fn: Any, dtypes: Any, pin_memory: bool) -> Any:
    """Arrow table -> what the loop receives, as Ray Data's ``iter_torch_batches`` collates."""
    from ray.data.block import BlockAccessor
    from ray.data.collate_fn import (ArrowBatchCollateFn, DefaultCollateFn, NumpyBatchCollateFn,
                                     PandasBatchCollateFn)

    if collate_fn is not None and dtypes is not None:
        raise ConfigError("collate_fn cannot be used with dtypes (as in Ray Data): convert dtypes inside collate_fn")
    if collate_fn is None:
        fn: Any = DefaultCollateFn(dtypes=dtypes, combine_chunks=True)
        convert = None
    elif isinstance(collate_fn, ArrowBatchCollateFn):
        fn, convert = collate_fn, None
    elif isinstance(collate_fn, (NumpyBatchCollateFn, PandasBatchCollateFn)):
        fn, convert = collate_fn, "numpy" if isinstance(collate_fn, NumpyBatchCollateFn) else "pandas"
    else:
        raise ConfigError(f"collate_fn must be a Ray Data ArrowBatchCollateFn, NumpyBatchCollateFn or "
                          f"PandasBatchCollateFn (as iter_torch_batches takes), got {type(collate_fn).__name__}")

    def collate(table: pyarrow.Table) -> Any:
        batch = fn(table if convert is None else BlockAccessor.for_block(table).to_batch_format(convert))
        if pin_memory:
            from ray.data.collate_fn import is_tensor_batch_type
            from ray.data.util.torch_utils import pin_tensors_to_memory

            batch = pin_tensors_to_memory(batch) if is_tensor_batch_type(batch) else batch
        return batch

    return collate

"""Data-parallel updates under `torchrun`: every rank holds the model, each takes a shard of the batch.

Collection stays on rank 0 (it owns the fleet, the backend and the loop); the other ranks are
followers that receive each batch from rank 0, run the same `Learner` step on their shard and stop
when rank 0 sends the end marker. The step is exact, not approximate:

- advantages are computed on the whole batch on every rank (ERPO's std is per environment over
  the batch, so it cannot be computed per shard);
- each rank's loss is its shard's token sum divided by the batch's global kept-token count, so
  the gradients summed over ranks (one flat all-reduce) are the full-batch gradient;
- every rank then clips and steps on identical gradients, so the weights stay identical without
  being broadcast.

`torch.distributed` is used directly (gloo on CPU, nccl on GPU), as accelerate would, without
wrapping the model: the loop needs only one all-reduce per step and the batch broadcast.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .trajectory import Trajectory

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    rank: int
    world: int
    local_rank: int = 0

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's items: every `world`-th one, starting at `rank`."""
        return list(items[self.rank :: self.world])

    def broadcast(self, payload: list[Trajectory] | None = None) -> list[Trajectory] | None:
        """Rank 0's `payload` on every rank (others pass nothing): a batch, or None to stop."""
        import torch.distributed as dist

        box = [payload if self.is_leader else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_reduce_grads(self, params: Sequence[Any]) -> None:
        """Sum every parameter's gradient over ranks in one flat all-reduce (missing grads count as 0)."""
        import torch
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    def all_reduce_sums(self, values: Sequence[float], device: Any) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return [float(v) for v in t.tolist()]


def init_from_env(device: str = "cpu") -> DataParallel | None:
    """Join the process group `torchrun` describes (WORLD_SIZE > 1); None for a single process.

    The backend follows the device: nccl for cuda (each rank on `cuda:LOCAL_RANK`), gloo otherwise.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return DataParallel(rank=rank, world=world, local_rank=local_rank)


def rank_device(device: str, dp: DataParallel | None) -> str:
    """`cuda` becomes `cuda:LOCAL_RANK` under torchrun; other devices are unchanged."""
    if dp is not None and device.startswith("cuda"):
        return f"cuda:{dp.local_rank}"
    return device


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()

"""Process group and FSDP2 setup; one process without torchrun, FSDP2 over all ranks under it."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistributedContext:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            tensor = tensor.clone()
            dist.all_reduce(tensor)
        return tensor

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group together, after a successful run only. A process that exits with
        its gloo group alive can abort in interpreter teardown ("terminate called without an active
        exception": gloo's threads still hold work with tensors), which fails the rank and its
        peers' torchrun exit barrier. After an error this is not called: destroying the group while
        a peer is inside a collective can hang."""
        if self.enabled:
            dist.barrier()
            dist.destroy_process_group()


def init_distributed(device: str | None = None) -> DistributedContext:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; NCCL on GPUs, gloo on CPU."""
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if "RANK" not in os.environ:
        return DistributedContext(0, 1, torch.device("cuda" if use_cuda else "cpu"))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return DistributedContext(dist.get_rank(), dist.get_world_size(), dev)


def shard_model(model: torch.nn.Module, context: DistributedContext) -> torch.nn.Module:
    """FSDP2: the draft is one unit (a few layers at most); bf16 compute on GPU."""
    if not context.enabled:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if context.device.type == "cuda":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(model, mp_policy=policy)
    return model

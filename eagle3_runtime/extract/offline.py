"""Offline extraction: hidden states of every generated conversation, written as shards on disk.

The extraction server's connector writes one safetensors file per request into a scratch
directory; this module reads each back, pairs it with the record's loss mask, adds the target's
top-1 token per position (its final norm and head over the last-layer states: once here instead
of every epoch in the trainer), appends it to the shards (eagle3_runtime/hidden_states.py) in
input order and deletes the scratch file. A killed run resumes after the last complete shard.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

import torch
from safetensors.torch import load_file

from eagle3_runtime.extract.server import request_hidden_states, served_model
from eagle3_runtime.hidden_states import HiddenStateSample, ShardWriter
from eagle3_runtime.pinned_target import PinnedTarget
from eagle3_runtime.progress import ProgressReporter
from eagle3_runtime.target import TargetHead
from eagle3_runtime.vllm_client import open_session

log = logging.getLogger(__name__)


def _wait_for_file(path: Path, timeout_s: float) -> None:
    # The connector renames the file into place once written; the HTTP answer may come first.
    deadline = time.monotonic() + timeout_s
    error = Path(f"{path}.error")
    while not path.exists():
        if error.exists():
            message = error.read_text()
            error.unlink()
            raise RuntimeError(f"the extraction server could not write {path}: {message}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the extraction server did not write {path} within {timeout_s:.0f} s")
        time.sleep(0.02)


def file_samples(
    server_url: str,
    records: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    layer_ids: list[int] | None = None,
    concurrency: int = 4,
    file_timeout_s: float = 300.0,
) -> Iterator[HiddenStateSample]:
    """Samples for `(input_ids, loss_mask)` pairs from a file-transport extraction server, in input order.

    The server must write where this process can read (the same machine or a shared volume).
    """
    batch_size = max(1, concurrency) * 4
    iterator = iter(records)
    while batch := list(islice(iterator, batch_size)):
        params = asyncio.run(_request_batch(server_url, [ids for ids, _ in batch], concurrency))
        served = params[0].get("hidden_states_layer_ids")
        if params[0].get("hidden_states_transport") != "file":
            raise RuntimeError(f"{server_url} is not a file-transport extraction server")
        if layer_ids is not None and served[:-1] != list(layer_ids):
            raise ValueError(
                f"{server_url} captures layers {served[:-1]}, but layers {layer_ids} were asked for"
            )
        for (input_ids, loss_mask), param in zip(batch, params, strict=True):
            path = Path(param["hidden_states_path"])
            _wait_for_file(path, file_timeout_s)
            tensors = load_file(str(path))
            os.unlink(path)
            if not torch.equal(tensors["token_ids"], input_ids):
                raise RuntimeError(f"{path} holds the states of other tokens")
            yield HiddenStateSample(
                input_ids=input_ids, loss_mask=loss_mask, hidden_states=tensors["hidden_states"]
            )


def with_target_top1(
    samples: Iterable[HiddenStateSample], head: TargetHead, *, chunk_tokens: int = 4096
) -> Iterator[HiddenStateSample]:
    """The samples with `target_top1` set: the target's argmax over its full vocabulary at each
    position (what the trainer's out-of-vocabulary mask reads), on the head's device."""
    device = head.lm_head_weight.device
    for sample in samples:
        last = sample.last_hidden_state
        sample.target_top1 = torch.cat(
            [head(chunk.to(device)).argmax(-1).cpu() for chunk in last.split(chunk_tokens)]
        )
        yield sample


async def _request_batch(server_url: str, batch: list[torch.Tensor], concurrency: int) -> list[dict]:
    gate = asyncio.Semaphore(concurrency)
    async with open_session(server_url, concurrency) as session:
        model = await served_model(session)

        async def one(ids: torch.Tensor) -> dict:
            async with gate:
                return await request_hidden_states(session, model, ids.tolist(), "file")

        return await asyncio.gather(*(one(ids) for ids in batch))


def write_offline_shards(
    samples_for: callable,
    records: list[tuple[torch.Tensor, torch.Tensor]],
    output_dir: Path,
    *,
    layer_ids: list[int],
    num_hidden_layers: int,
    hidden_size: int,
    samples_per_shard: int = 64,
    reporter: ProgressReporter | None = None,
    target: PinnedTarget | None = None,
):
    """Append the samples of `records` not yet in `output_dir`; `samples_for(pairs)` computes them."""
    writer = ShardWriter(
        output_dir,
        layer_ids=layer_ids,
        num_hidden_layers=num_hidden_layers,
        hidden_size=hidden_size,
        samples_per_shard=samples_per_shard,
        target=target,
    )
    done = writer.samples_written
    if done:
        log.info("resuming extraction after %d samples", done)
    for count, sample in enumerate(samples_for(records[done:]), done + 1):
        writer.add(sample)
        if reporter:
            reporter.report(samples=count, total_samples=len(records), force=count == len(records))
    return writer.close()

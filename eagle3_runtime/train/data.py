"""From any iterable of HiddenStateSample to packed rows and per-rank batches.

Offline shards, the streaming source and the online (in-process target) source all yield
`HiddenStateSample`s; the trainer never knows which one it reads. Samples are packed in
order into rows of `seq_len` tokens (a longer sample is cut to `seq_len`); a document id
per token keeps attention and the TTT shifts inside each document.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch

from eagle3_runtime.hidden_states import HiddenStateSample

SampleSource = Callable[[], Iterable[HiddenStateSample]]  # a fresh pass over the dataset per call
PADDING_DOCUMENT = -1
T = TypeVar("T")


@dataclass
class PackedRow:
    input_ids: torch.Tensor  # [T]
    aux_hidden_states: torch.Tensor  # [T, 3H]
    last_hidden_state: torch.Tensor  # [T, H]
    predict_mask: torch.Tensor  # [T] bool: the target's prediction at t (of token t+1) is trained on
    document_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    num_tokens: int  # real (non-padding) tokens
    target_top1: torch.Tensor | None = None  # [T]: when every sample carries the target's top-1


def check_sample(sample: HiddenStateSample, hidden_size: int, vocab_size: int) -> None:
    h = sample.hidden_states.shape[2]
    if h != hidden_size:
        raise ValueError(
            f"hidden states are {h} wide but the target's hidden_size is {hidden_size}: "
            "were they extracted from another model?"
        )
    if sample.input_ids.numel() and int(sample.input_ids.max()) >= vocab_size:
        raise ValueError(
            f"token id {int(sample.input_ids.max())} is outside the target vocabulary ({vocab_size})"
        )


def packed_groups(items: Iterable[T], length_of: Callable[[T], int], seq_len: int) -> Iterator[list[T]]:
    """Items in order, grouped into rows of at most `seq_len` tokens (an item counts at most
    `seq_len`; items under two tokens are dropped: nothing to predict)."""
    pending: list[T] = []
    used = 0
    for item in items:
        length = min(length_of(item), seq_len)
        if length < 2:
            continue
        if used + length > seq_len:
            yield pending
            pending, used = [], 0
        pending.append(item)
        used += length
    if pending:
        yield pending


def pack_rows(
    samples: Iterable[HiddenStateSample], seq_len: int, *, hidden_size: int, vocab_size: int
) -> Iterator[PackedRow]:
    def checked() -> Iterator[HiddenStateSample]:
        for sample in samples:
            check_sample(sample, hidden_size, vocab_size)
            yield sample

    for group in packed_groups(checked(), lambda s: s.input_ids.shape[0], seq_len):
        yield _build_row(group, seq_len)


def rows_per_epoch(lengths: Iterable[int], seq_len: int) -> int:
    """Packed rows in one pass over samples of these token lengths (what RowStream yields)."""
    return sum(1 for _ in packed_groups(lengths, int, seq_len))


def steps_for_epochs(epochs: int, rows_in_epoch: int, rows_per_step: int) -> int:
    """Optimizer steps that show every row `epochs` times (the last step may start the next pass)."""
    if rows_in_epoch <= 0:
        raise ValueError("the dataset is empty: no sample with at least two tokens")
    return max(1, math.ceil(epochs * rows_in_epoch / rows_per_step))


def _build_row(samples: list[HiddenStateSample], seq_len: int) -> PackedRow:
    hidden = samples[0].hidden_states
    h = hidden.shape[2]
    ids = torch.zeros(seq_len, dtype=torch.int64)
    aux = torch.zeros(seq_len, 3 * h, dtype=hidden.dtype)
    last = torch.zeros(seq_len, h, dtype=hidden.dtype)
    predict = torch.zeros(seq_len, dtype=torch.bool)
    docs = torch.full((seq_len,), PADDING_DOCUMENT, dtype=torch.int64)
    positions = torch.zeros(seq_len, dtype=torch.int64)
    carries_top1 = all(sample.target_top1 is not None for sample in samples)
    top1 = torch.zeros(seq_len, dtype=torch.int64) if carries_top1 else None
    start = 0
    for doc, sample in enumerate(samples):
        n = min(sample.input_ids.shape[0], seq_len)
        end = start + n
        ids[start:end] = sample.input_ids[:n]
        aux[start:end] = sample.aux_hidden_states[:n]
        last[start:end] = sample.last_hidden_state[:n]
        # The prediction made at t is of token t+1: trained on when t+1 is a loss-masked token.
        predict[start : end - 1] = sample.loss_mask[1:n].to(torch.bool)
        docs[start:end] = doc
        positions[start:end] = torch.arange(n)
        if top1 is not None:
            top1[start:end] = sample.target_top1[:n]
        start = end
    return PackedRow(ids, aux, last, predict, docs, positions, start, top1)


class RowStream:
    """Endless rows over repeated passes (epochs); `rows_consumed` is the resume position."""

    def __init__(self, source: SampleSource, seq_len: int, *, hidden_size: int, vocab_size: int):
        self.source, self.seq_len = source, seq_len
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.rows_consumed = 0
        self._rows: Iterator[PackedRow] = iter(())
        self._rows_this_pass = 0

    def _next_pass(self) -> None:
        self._rows = pack_rows(
            self.source(), self.seq_len, hidden_size=self.hidden_size, vocab_size=self.vocab_size
        )
        self._rows_this_pass = 0

    def next_row(self) -> PackedRow:
        row = next(self._rows, None)
        if row is None:
            self._next_pass()
            row = next(self._rows, None)
            if row is None:
                raise ValueError("the dataset is empty: no sample with at least two tokens")
        self._rows_this_pass += 1
        self.rows_consumed += 1
        return row

    def skip(self, rows: int) -> None:
        """Fast-forward to a checkpoint's position (the rows are re-read, not stored)."""
        for _ in range(rows):
            self.next_row()

    def take(self, rows: int, *, rank: int, world_size: int) -> list[PackedRow]:
        """The next `rows` rows of the global batch; this rank keeps every world_size-th."""
        batch = [self.next_row() for _ in range(rows)]
        return batch[rank::world_size]


def stack_rows(rows: list[PackedRow], device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    def stack(name: str, cast: torch.dtype | None = None) -> torch.Tensor:
        t = torch.stack([getattr(r, name) for r in rows]).to(device, non_blocking=True)
        return t.to(cast) if cast is not None else t

    tensors = {
        "input_ids": stack("input_ids"),
        "aux_hidden_states": stack("aux_hidden_states", dtype),
        "last_hidden_state": stack("last_hidden_state", dtype),
        "predict_mask": stack("predict_mask"),
        "document_ids": stack("document_ids"),
        "positions": stack("positions"),
    }
    if all(row.target_top1 is not None for row in rows):
        tensors["target_top1"] = stack("target_top1")
    return tensors

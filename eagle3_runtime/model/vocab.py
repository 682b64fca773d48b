"""Draft vocabulary: the most frequent loss-masked target tokens, and vLLM's d2t / t2d maps."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class DraftVocab:
    used_ids: torch.Tensor  # [N] int64 target ids, ascending: draft id i is target id used_ids[i]
    target_vocab_size: int

    @property
    def size(self) -> int:
        return self.used_ids.numel()

    @property
    def is_full(self) -> bool:
        """Draft vocab == target vocab: vLLM then expects no d2t/t2d in the checkpoint."""
        return self.size == self.target_vocab_size

    @property
    def d2t(self) -> torch.Tensor:
        """Offsets: target_id = draft_id + d2t[draft_id] (vLLM's draft_id_to_target_id)."""
        return self.used_ids - torch.arange(self.size, dtype=torch.int64)

    @property
    def t2d(self) -> torch.Tensor:
        """Bool mask over the target vocabulary: which target tokens the draft can propose."""
        mask = torch.zeros(self.target_vocab_size, dtype=torch.bool)
        mask[self.used_ids] = True
        return mask

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, target_vocab_size: int) -> DraftVocab:
        return cls(d2t.to(torch.int64) + torch.arange(d2t.numel(), dtype=torch.int64), target_vocab_size)

    @classmethod
    def full(cls, target_vocab_size: int) -> DraftVocab:
        return cls(torch.arange(target_vocab_size, dtype=torch.int64), target_vocab_size)


def count_tokens(
    token_batches: Iterable[tuple[torch.Tensor, torch.Tensor]], target_vocab_size: int
) -> torch.Tensor:
    """Frequencies of the tokens the draft must predict: loss-masked (assistant) tokens."""
    counts = torch.zeros(target_vocab_size, dtype=torch.int64)
    for input_ids, loss_mask in token_batches:
        ids = input_ids[loss_mask.to(torch.bool)].to(torch.int64)
        if ids.numel() and int(ids.max()) >= target_vocab_size:
            raise ValueError(
                f"token id {int(ids.max())} is outside the target vocabulary ({target_vocab_size})"
            )
        counts += torch.bincount(ids, minlength=target_vocab_size)
    return counts


def build_draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
    """Top `draft_vocab_size` tokens by count (ties go to the lower id), sorted by id."""
    target_vocab_size = counts.numel()
    if draft_vocab_size > target_vocab_size:
        raise ValueError(
            f"draft vocabulary {draft_vocab_size} is larger than the target's {target_vocab_size}"
        )
    if draft_vocab_size <= 0:
        raise ValueError(f"draft vocabulary size must be positive, got {draft_vocab_size}")
    if int(counts.sum()) == 0:
        raise ValueError("no loss-masked tokens to count: the dataset is empty or every loss mask is false")
    # A stable sort on -count keeps ascending ids among equal counts: deterministic choice.
    order = torch.sort(-counts, stable=True).indices
    used = torch.sort(order[:draft_vocab_size]).values
    return DraftVocab(used.to(torch.int64), target_vocab_size)

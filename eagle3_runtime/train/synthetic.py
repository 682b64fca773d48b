"""Synthetic target states with learnable structure, for the trainer's tests and benchmarks.

Tokens follow a noisy affine Markov chain over the vocabulary; the target's "last layer"
state at t points at the lm_head row of token t+1, so the target's distribution is sharp
and predictable, and the aux states mix the current token's embedding with noise.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from eagle3_runtime.hidden_states import HiddenStateSample


def synthetic_target(vocab_size: int, hidden_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embeddings": torch.randn(vocab_size, hidden_size, generator=g) * 0.5,
        "lm_head": torch.randn(vocab_size, hidden_size, generator=g) / hidden_size**0.5,
        "norm": torch.ones(hidden_size),
    }


def synthetic_samples(
    target: dict[str, torch.Tensor],
    *,
    num_samples: int,
    length: int,
    seed: int = 0,
    noise: float = 0.1,
    dtype: torch.dtype = torch.float32,
) -> Iterator[HiddenStateSample]:
    vocab_size, hidden_size = target["embeddings"].shape
    g = torch.Generator().manual_seed(seed)
    for _ in range(num_samples):
        ids = torch.empty(length, dtype=torch.int64)
        ids[0] = torch.randint(vocab_size, (1,), generator=g)
        jumps = torch.rand(length, generator=g) < noise
        random_ids = torch.randint(vocab_size, (length,), generator=g)
        for t in range(1, length):
            ids[t] = random_ids[t] if jumps[t] else (7 * ids[t - 1] + 3) % vocab_size
        next_ids = torch.cat([ids[1:], ids[:1]])
        last = target["lm_head"][next_ids] * hidden_size**0.5 * 4
        aux = target["embeddings"][ids, None, :] + 0.1 * torch.randn(length, 3, hidden_size, generator=g)
        loss_mask = torch.ones(length, dtype=torch.bool)
        loss_mask[: length // 4] = False  # a "prompt" the draft does not learn
        yield HiddenStateSample(
            input_ids=ids, loss_mask=loss_mask, hidden_states=torch.cat([aux, last[:, None]], 1).to(dtype)
        )

"""Training-time-test (TTT) attention.

With k unrolled draft steps over one packed sequence of length T, the query of step i
at slot t attends to
  - step-0 keys at slots s <= t of the same document (the target-fed pass, causal), and
  - the key of every step 1..i at the same slot t (the draft's own earlier guesses there),
which is what vLLM's KV cache holds when the draft proposes its (i+1)-th token.

Two implementations of the same function:
  - `eager`: scores against step-0 keys under a [T, T] document-causal mask plus the i
    diagonal scores as extra columns, one softmax over both. Memory O(T^2) per step;
    the reference, and what runs on CPU.
  - `flex`: FlexAttention over the concatenated keys [K_0, K_1..K_i] with a block-sparse
    mask; the diagonal blocks are the only non-empty blocks beyond step 0, so the extra
    cost is about one key block per earlier step and no dense mask is materialised.
"""

from __future__ import annotations

import functools

import torch


class TTTAttention:
    """Holds the keys/values of earlier steps for one batch; call once per step, in order."""

    def __init__(self, document_ids: torch.Tensor, *, backend: str = "eager"):
        if backend not in ("eager", "flex"):
            raise ValueError(f"unknown attention backend {backend!r}")
        self.document_ids = document_ids  # [B, T]; padding has its own id (-1)
        self.backend = backend
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._causal: torch.Tensor | None = None

    @property
    def step(self) -> int:
        return len(self.keys)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, Hq, T, D], k/v [B, Hkv, T, D] of the current step -> [B, Hq, T, D]."""
        self.keys.append(k)
        self.values.append(v)
        if self.backend == "flex":
            return self._flex(q)
        return self._eager(q)

    def document_causal_mask(self) -> torch.Tensor:
        """[B, 1, T, T] bool: slot s visible from slot t in step 0."""
        if self._causal is None:
            doc = self.document_ids
            t = doc.shape[1]
            causal = torch.ones(t, t, dtype=torch.bool, device=doc.device).tril()
            self._causal = (causal & (doc[:, :, None] == doc[:, None, :]))[:, None]
        return self._causal

    def _eager(self, q: torch.Tensor) -> torch.Tensor:
        groups = q.shape[1] // self.keys[0].shape[1]
        expand = (lambda x: x.repeat_interleave(groups, dim=1)) if groups > 1 else (lambda x: x)
        scale = q.shape[-1] ** -0.5
        k0, v0 = expand(self.keys[0]), expand(self.values[0])
        scores = (q @ k0.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~self.document_causal_mask(), float("-inf"))
        later_k = [expand(k) for k in self.keys[1:]]
        later_v = [expand(v) for v in self.values[1:]]
        if later_k:
            diagonal = torch.stack([(q * k).sum(-1) for k in later_k], dim=-1) * scale  # [B, H, T, i]
            scores = torch.cat([scores, diagonal], dim=-1)
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        t = q.shape[2]
        out = probs[..., :t] @ v0
        for j, v in enumerate(later_v):
            out = out + probs[..., t + j, None] * v
        return out

    def _flex(self, q: torch.Tensor) -> torch.Tensor:
        k = torch.cat(self.keys, dim=2) if self.step > 1 else self.keys[0]
        v = torch.cat(self.values, dim=2) if self.step > 1 else self.values[0]
        block_mask = _ttt_block_mask(self.document_ids, self.step)
        # Inside the trainer's compiled loss flex is traced with the rest; called eagerly it needs its own compile.
        flex = _flex_attention() if torch.compiler.is_compiling() else _compiled_flex()
        return flex(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])


def _ttt_block_mask(document_ids: torch.Tensor, steps: int):
    from torch.nn.attention.flex_attention import create_block_mask

    batch, t = document_ids.shape

    def mask_mod(b, h, q_idx, kv_idx):
        kv_slot = kv_idx % t
        same_document = document_ids[b, q_idx] == document_ids[b, kv_slot]
        causal = (kv_idx < t) & (kv_slot <= q_idx) & same_document
        diagonal = (kv_idx >= t) & (kv_slot == q_idx)
        return causal | diagonal

    return create_block_mask(mask_mod, batch, None, t, steps * t, device=document_ids.device)


def _flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


@functools.cache
def _compiled_flex():
    # FlexAttention is only efficient compiled; on CPU (tests) the eager path is exact and small.
    if torch.cuda.is_available():
        return torch.compile(_flex_attention(), dynamic=False)
    return _flex_attention()

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
  - `flex`: FlexAttention over the step-0 keys under a block-sparse document-causal mask
    (built once per batch, the same for every step), returning its log-sum-exp; the i
    diagonal scores are plain dot products, merged in by that log-sum-exp. The diagonal
    never costs whole key blocks (a flex pass over [K_0, K_1..K_i] computes a full
    128-key block per earlier step for one useful score per row) and no dense mask is
    materialised.
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
        self._block_mask = None  # flex: the step-0 document-causal block mask, built on first use

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
        if self._block_mask is None:
            self._block_mask = _document_causal_block_mask(self.document_ids)
        # Inside the trainer's compiled loss flex is traced with the rest; called eagerly it needs its own compile.
        flex = _flex_attention() if torch.compiler.is_compiling() else _compiled_flex()
        k0, v0 = self.keys[0], self.values[0]
        options = dict(block_mask=self._block_mask, enable_gqa=q.shape[1] != k0.shape[1])
        if self.step == 1:
            return flex(q, k0, v0, **options)
        from torch.nn.attention.flex_attention import AuxRequest

        out, aux = flex(q, k0, v0, return_aux=AuxRequest(lse=True), **options)
        return _merge_diagonal(q, out, aux.lse, self.keys[1:], self.values[1:])


def _merge_diagonal(q, causal_out, causal_lse, later_keys, later_values) -> torch.Tensor:
    """Attention over the step-0 keys (`causal_out` and its log-sum-exp) joined with one more key
    per earlier step at the query's own slot: softmax over [lse, s_1..s_i] weighs the parts."""
    kv_heads = later_keys[0].shape[1]
    heads = (kv_heads, q.shape[1] // kv_heads)  # GQA: query head h reads key head h // groups
    q_grouped = q.float().unflatten(1, heads)
    scores = [(q_grouped * k.float()[:, :, None]).sum(-1) * q.shape[-1] ** -0.5 for k in later_keys]
    weights = torch.softmax(torch.stack([causal_lse.unflatten(1, heads), *scores], dim=-1), dim=-1)
    out = weights[..., :1] * causal_out.float().unflatten(1, heads)
    for j, v in enumerate(later_values, start=1):
        out = out + weights[..., j, None] * v.float()[:, :, None]
    return out.flatten(1, 2).to(q.dtype)


def _document_causal_block_mask(document_ids: torch.Tensor):
    from torch.nn.attention.flex_attention import create_block_mask

    batch, t = document_ids.shape

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (document_ids[b, q_idx] == document_ids[b, kv_idx])

    return create_block_mask(mask_mod, batch, None, t, t, device=document_ids.device)


def _flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


@functools.cache
def _compiled_flex():
    # FlexAttention is only efficient compiled; on CPU (tests) the eager path is exact and small.
    if torch.cuda.is_available():
        return torch.compile(_flex_attention(), dynamic=False)
    return _flex_attention()

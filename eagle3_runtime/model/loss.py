"""Training-time-test unroll, the distillation loss, and per-position metrics.

Alignment (slot t of a packed row, step i = 0..k-1), as vLLM runs the draft:
  - step 0 reads the target's aux states at t (through fc) and the token at t+1;
    step i > 0 reads its own step i-1 output at t and the ground-truth token at t+1+i;
  - step i runs at position pos(t) + i and is trained against the target's
    distribution at t+1+i (restricted to the draft vocabulary and renormalised);
  - a slot counts for step i only if t+1+i is in the same document, the token the
    target predicts there is loss-masked (`predict_mask`), and the target's top-1 there
    is inside the draft vocabulary.
Loss = sum_i decay**i * mean over counted slots of KL(target || draft).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from eagle3_runtime.model.attention import TTTAttention

if TYPE_CHECKING:
    from eagle3_runtime.model.draft import Eagle3Draft


@dataclass
class TTTBatch:
    input_ids: torch.Tensor  # [B, T] int64
    aux_hidden_states: torch.Tensor  # [B, T, 3*H_target]
    # [B, T, V] the target's logits, no grad: the full vocabulary, or only the draft vocabulary's
    # rows when `target_top1` carries the target's choice (the out-of-vocabulary mask needs no more)
    target_logits: torch.Tensor
    predict_mask: torch.Tensor  # [B, T] bool: the target's prediction at t is a training target
    document_ids: torch.Tensor  # [B, T] int64, -1 for padding
    positions: torch.Tensor  # [B, T] int64, position within the document
    target_top1: torch.Tensor | None = None  # [B, T] int64: the target's argmax over its full vocabulary


@dataclass
class TTTStats:
    """Per-step sums (tensors of shape [k]); sum them over ranks, then read the ratios."""

    kl_sum: torch.Tensor
    count: torch.Tensor
    correct: torch.Tensor
    conditional_correct: torch.Tensor
    conditional_count: torch.Tensor

    def as_tensor(self) -> torch.Tensor:
        return torch.stack(
            [self.kl_sum, self.count, self.correct, self.conditional_correct, self.conditional_count]
        )

    @classmethod
    def from_tensor(cls, stacked: torch.Tensor) -> TTTStats:
        return cls(*stacked.unbind(0))

    def summary(self, decay: float) -> dict[str, float | list[float]]:
        count = self.count.clamp(min=1)
        kl = (self.kl_sum / count).tolist()
        accuracy = (self.correct / count).tolist()
        conditional = (self.conditional_correct / self.conditional_count.clamp(min=1)).tolist()
        return {
            "loss": sum(decay**i * v for i, v in enumerate(kl)),
            "loss_per_position": kl,
            "accuracy_per_position": accuracy,
            "conditional_accuracy_per_position": conditional,
            "simulated_acceptance_length": simulated_acceptance_length(conditional),
        }


def simulated_acceptance_length(conditional_accuracy: list[float]) -> float:
    """1 + sum_i prod_{j<=i} acc_j: expected tokens per verification step, as vLLM counts
    it (the verified bonus token plus the accepted draft tokens)."""
    total, running = 1.0, 1.0
    for acc in conditional_accuracy:
        running *= acc
        total += running
    return total


def _shift_left(x: torch.Tensor, shift: int, fill) -> torch.Tensor:
    pad = x.new_full((x.shape[0], shift, *x.shape[2:]), fill)
    return torch.cat([x[:, shift:], pad], dim=1)


def step_masks(batch: TTTBatch, in_draft_vocab: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """[B, T] bool per step: which slots count for that step's loss and metrics."""
    trainable = batch.predict_mask & in_draft_vocab
    masks = []
    for i in range(steps):
        shift = 1 + i
        same_document = _shift_left(batch.document_ids, shift, -2) == batch.document_ids
        masks.append(_shift_left(trainable, shift, False) & same_document)
    return masks


def soft_kl(logits: torch.Tensor, target_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-row KL(target || softmax(logits)), in float32, for normalised `target_log_probs`:
    sum p (log p - z) + logsumexp(z). Both reductions and the backward (softmax(z) - p) each
    read the logits once; through log_softmax they took three passes forward and two back."""
    logits = logits.float()
    return (target_log_probs.exp() * (target_log_probs - logits)).sum(-1) + torch.logsumexp(logits, dim=-1)


class _ChunkedHeadKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, target_log_probs, source_rows, choice, row_weights, chunk_rows):
        weight_cast = weight.to(x.dtype)  # what autocast's lm_head multiplies by
        kls, corrects, input_grads = [], [], []
        # A frozen lm_head (speculators' recipe) needs no weight gradient.
        train_weight = ctx.needs_input_grad[1]
        weight_grad = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if train_weight else None
        )
        for start in range(0, x.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            logits = x[rows] @ weight_cast.t()
            log_p = target_log_probs[source_rows[rows]]
            kls.append(soft_kl(logits, log_p))
            corrects.append(logits.argmax(-1) == choice[rows])
            # d KL / d logits = softmax(logits) - p, times each row's weight in the loss
            logits_grad = (torch.softmax(logits.float(), -1) - log_p.exp()) * row_weights[rows, None]
            logits_grad = logits_grad.to(x.dtype)
            input_grads.append(logits_grad @ weight_cast)
            if train_weight:
                weight_grad += (logits_grad.t() @ x[rows]).float()
        kl, correct = torch.cat(kls), torch.cat(corrects)
        ctx.save_for_backward(torch.cat(input_grads), weight_grad.to(weight.dtype) if train_weight else None)
        ctx.mark_non_differentiable(kl, correct)
        # A slot of weight 0 (not counted) adds nothing, whatever its KL.
        loss = torch.where(row_weights > 0, kl * row_weights, 0.0).sum()
        return loss, kl, correct

    @staticmethod
    def backward(ctx, loss_grad, _kl_grad, _correct_grad):
        input_grad, weight_grad = ctx.saved_tensors
        weight_grad = None if weight_grad is None else weight_grad * loss_grad
        return input_grad * loss_grad, weight_grad, None, None, None, None, None


def chunked_head_kl(
    x: torch.Tensor,
    weight: torch.Tensor,
    target_log_probs: torch.Tensor,
    source_rows: torch.Tensor,
    choice: torch.Tensor,
    row_weights: torch.Tensor,
    chunk_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sum_r row_weights[r] * KL(target_log_probs[source_rows[r]] || softmax(x[r] @ weight.T)),
    the per-row KL and whether the row's argmax is `choice[r]`, `chunk_rows` rows at a time.

    The loss's gradients are computed in the forward pass, chunk by chunk (the weighted sum is
    linear in the per-row KL): no chunk's [rows, V] logits outlive it, where autograd would keep
    all of them (the logits of every TTT step, the largest tensors of a long row) for backward.
    The same matmuls as lm_head's forward and backward, none recomputed.
    """
    if chunk_rows < 1:
        raise ValueError(f"loss chunks need at least one row, got {chunk_rows}")
    return _ChunkedHeadKL.apply(x, weight, target_log_probs, source_rows, choice, row_weights, chunk_rows)


def ttt_loss(
    draft: Eagle3Draft,
    batch: TTTBatch,
    *,
    steps: int,
    decay: float,
    draft_ids: torch.Tensor | None,
    attention_backend: str = "eager",
    reduce_counts: Callable[[torch.Tensor], torch.Tensor] = lambda counts: counts,
    gather_counted: bool = True,
    loss_chunk_rows: int | None = None,
) -> tuple[torch.Tensor, TTTStats]:
    """Loss of one batch, normalised by the counted slots of all ranks (`reduce_counts`).

    `draft_ids`: target ids of the draft vocabulary (None when it is the whole vocabulary).
    `loss_chunk_rows`: lm_head and the KL over this many rows at a time, their gradients
    included (`chunked_head_kl`): the logits of all steps are never alive at once. None: in one go.
    """
    with torch.no_grad():
        if batch.target_top1 is None:
            full = batch.target_logits
            target_top1 = full.argmax(-1)
            restricted = full if draft_ids is None else full.index_select(-1, draft_ids)
        else:  # the data carries the target's choice: its logits are the draft vocabulary's rows already
            target_top1, restricted = batch.target_top1, batch.target_logits
        in_draft = draft.t2d[target_top1]
        target_log_probs = F.log_softmax(restricted.float(), dim=-1)
        target_choice = restricted.argmax(-1)
        masks = step_masks(batch, in_draft, steps)
        global_counts = reduce_counts(torch.stack([m.sum() for m in masks]).to(torch.float32))

    attend = [TTTAttention(batch.document_ids, backend=attention_backend) for _ in range(draft.num_layers)]
    hidden = draft.combine_hidden_states(batch.aux_hidden_states)
    outputs = []
    for i in range(steps):
        hidden = draft.step(_shift_left(batch.input_ids, 1 + i, 0), hidden, batch.positions + i, attend)
        outputs.append(hidden)

    # lm_head and the loss run once, over all steps (no later step reads the logits): one lm_head
    # product over k*T rows gives its weight gradient in one matmul instead of k summed ones, and
    # the logits' gradient is written by one kernel. Step i at slot s is trained on the target at
    # s + 1 + i, read by index: no shifted copy of the [T, V] targets.
    t = batch.input_ids.shape[1]
    offsets = torch.arange(1, steps + 1, device=hidden.device)
    target_slot = (torch.arange(t, device=hidden.device) + offsets[:, None]).clamp(max=t - 1)  # [k, T]
    choice = target_choice[:, target_slot]  # [B, k, T]
    counted = torch.stack(masks, dim=1)  # [B, k, T]; false where s + 1 + i is past the row
    hidden_states = torch.stack(outputs, dim=1)
    if gather_counted:
        # Only counted slots go through lm_head and the loss (saves FLOPs on masked slots).
        def pick(values: torch.Tensor) -> torch.Tensor:
            return values[counted]

        # Back to [B, k, T] by gathering each counted slot's place in the compact list.
        place = (counted.flatten().cumsum(0) - 1).clamp(min=0).view(counted.shape)

        def spread(values: torch.Tensor) -> torch.Tensor:
            values = torch.cat([values, values.new_zeros(1)])  # a place to gather from when none counts
            return torch.where(counted, values[place], values.new_zeros(()))

    else:
        # Every slot, masked after: static shapes, no host sync (what compiled GPU code wants).
        def pick(values: torch.Tensor) -> torch.Tensor:
            return values.flatten(0, 2)

        def spread(values: torch.Tensor) -> torch.Tensor:
            return torch.where(counted, values.view(counted.shape), values.new_zeros(()))

    if loss_chunk_rows is not None:
        # Slot (b, i, s) reads row b * T + s + 1 + i of the [B * T, V] target log-probabilities.
        source = target_slot + (torch.arange(counted.shape[0], device=hidden.device) * t)[:, None, None]
        step_weights = decay ** offsets.sub(1).float() / global_counts.clamp(min=1)
        weights = torch.where(counted, step_weights[:, None], 0.0)
        loss, kl, correct = chunked_head_kl(
            draft.norm(pick(hidden_states)),
            draft.lm_head.weight,
            target_log_probs.flatten(0, 1),
            pick(source),
            pick(choice),
            pick(weights),
            loss_chunk_rows,
        )
        kl, correct = spread(kl), spread(correct)
    else:
        logits = draft.logits(pick(hidden_states))
        kl = spread(soft_kl(logits, pick(target_log_probs[:, target_slot])))  # targets [B, k, T, V]
        correct = spread(logits.argmax(-1) == pick(choice))
    kl_sum = kl.sum((0, 2))
    if loss_chunk_rows is None:
        loss = (decay ** offsets.sub(1).float() * kl_sum / global_counts.clamp(min=1)).sum()
    with torch.no_grad():
        # Conditional on every earlier step being right at that slot (what acceptance needs).
        right_so_far = correct.cumprod(dim=1)
        earlier_right = torch.cat([torch.ones_like(correct[:, :1]), right_so_far[:, :-1]], dim=1)
        conditional = counted & earlier_right
        stats = TTTStats(
            kl_sum=kl_sum.detach(),
            count=counted.sum((0, 2)).float(),
            correct=correct.sum((0, 2)).float(),
            conditional_correct=(conditional & correct).sum((0, 2)).float(),
            conditional_count=conditional.sum((0, 2)).float(),
        )
    return loss, stats


@functools.cache
def compiled_ttt_loss() -> Callable[..., tuple[torch.Tensor, TTTStats]]:
    """`ttt_loss` as one torch.compile graph: all TTT steps, the attention, the shifts, the masks
    and the KL fuse forward and backward (compiling only the dense layers left the unroll and
    the loss eager, memory-bound and launch-bound). Shapes are static: one packed batch shape."""
    return torch.compile(ttt_loss, dynamic=False)

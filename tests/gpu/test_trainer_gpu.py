"""The trainer's GPU path: the whole TTT loss compiled by inductor with FlexAttention, bf16
autocast, fused AdamW.

These tests need a CUDA GPU and fail without one. The project's CI machine has none, so
`make test` leaves this directory out; run them on a GPU machine with `make test-gpu`
(docs/testing.md records the last run).
"""

import pytest
import torch

from eagle3_runtime.model.loss import TTTBatch, compiled_ttt_loss, ttt_loss
from eagle3_runtime.model.vocab import build_draft_vocab
from tests.runtime.model.test_model import tiny_draft
from tests.runtime.train.test_trainer import losses, make_trainer

# FlexAttention's GPU kernels need a head dimension of at least 16 (the CPU tests use 8).
FLEX_HEAD_DIM = 16


@pytest.fixture(autouse=True)
def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.fail("these tests need a CUDA GPU (run `make test-gpu` on a GPU machine)")


def _batch(t_len: int) -> TTTBatch:
    g = torch.Generator().manual_seed(4)
    documents = torch.tensor([0] * (t_len // 3) + [1] * (t_len - t_len // 3))
    positions = torch.cat([torch.arange(t_len // 3), torch.arange(t_len - t_len // 3)])
    return TTTBatch(
        input_ids=torch.randint(0, 50, (1, t_len), generator=g).cuda(),
        aux_hidden_states=torch.randn(1, t_len, 96, generator=g).cuda(),
        target_logits=(torch.randn(1, t_len, 50, generator=g) * 3).cuda(),
        predict_mask=(torch.rand(1, t_len, generator=g) > 0.2).cuda(),
        document_ids=documents[None].cuda(),
        positions=positions[None].cuda(),
    )


@pytest.mark.parametrize(("num_layers", "loss_chunk_rows"), [(1, None), (2, None), (1, 500)])
def test_compiled_flex_loss_equals_the_eager_reference(num_layers, loss_chunk_rows):
    """What the trainer runs on GPU (inductor, FlexAttention) against the eager attention and
    eager loss, in fp32 with TF32 off: same loss, metrics and gradients; with `loss_chunk_rows`
    the compiled loss runs lm_head and the KL in chunks, the reference in one go."""
    torch.backends.cuda.matmul.allow_tf32 = False
    vocab = build_draft_vocab(torch.tensor([5] * 20 + [0] * 30), 20)
    batch = _batch(384)  # three 128-token attention blocks, a document boundary inside one
    results = []
    runs = ((ttt_loss, "eager", None), (compiled_ttt_loss(), "flex", loss_chunk_rows))
    for loss_fn, attention, chunk_rows in runs:
        draft = tiny_draft(num_layers=num_layers, head_dim=FLEX_HEAD_DIM).cuda()
        draft.d2t.copy_(vocab.d2t)
        draft.t2d.copy_(vocab.t2d)
        loss, stats = draft(
            batch,
            loss_fn=loss_fn,
            steps=4,
            decay=0.8,
            draft_ids=vocab.used_ids.cuda(),
            attention_backend=attention,
            gather_counted=False,
            loss_chunk_rows=chunk_rows,
        )
        loss.backward()
        grads = {name: p.grad for name, p in draft.named_parameters() if p.grad is not None}
        results.append((loss.detach(), stats.as_tensor(), grads))
    (ref_loss, ref_stats, ref_grads), (loss, stats, grads) = results
    assert torch.isfinite(ref_loss) and ref_loss > 0
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(stats, ref_stats)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-3, atol=1e-5, msg=name)


def test_gpu_training_learns_and_resumes_exactly(tmp_path):
    def trainer(name, steps, **kw):
        return make_trainer(tmp_path / name, steps=steps, device="cuda", head_dim=FLEX_HEAD_DIM, **kw)

    learner = trainer("learn", 30)
    assert learner.context.device.type == "cuda" and learner.loss_fn is compiled_ttt_loss()
    first = learner.train_step()
    for _ in range(29):
        last = learner.train_step()
    assert last["loss"] < 0.85 * first["loss"]
    assert last["simulated_acceptance_length"] > first["simulated_acceptance_length"]

    trainer("straight", 6, checkpoint_every=3).train()
    interrupted = trainer("resumed", 6, checkpoint_every=3)
    for _ in range(4):  # checkpoint at 3, then one more step that is lost in the "crash"
        interrupted.last_summary = interrupted.train_step()
        interrupted._log_metrics(interrupted.last_summary)
        if interrupted.step == 3:
            interrupted.save_checkpoint()
    resumed = trainer("resumed", 6, checkpoint_every=3)
    assert resumed.step == 3
    resumed.train()
    straight, again = losses(tmp_path / "straight"), losses(tmp_path / "resumed")
    assert sorted(again) == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        assert again[step] == pytest.approx(straight[step], rel=1e-5), step

"""Draft model, vocabulary mapping, TTT attention and loss against small hand-computed cases."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from eagle3_runtime.model.attention import TTTAttention
from eagle3_runtime.model.config import draft_config_from_target, resolve_layer_ids
from eagle3_runtime.model.draft import Eagle3Draft, init_weights
from eagle3_runtime.model.loss import TTTBatch, simulated_acceptance_length, soft_kl, step_masks, ttt_loss
from eagle3_runtime.model.vocab import DraftVocab, build_draft_vocab, count_tokens


def tiny_target_config(**overrides) -> LlamaConfig:
    fields = dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=4,
        vocab_size=50,
        max_position_embeddings=256,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def tiny_draft(draft_vocab_size=20, seed=0, num_layers=1, **target_overrides) -> Eagle3Draft:
    config = draft_config_from_target(
        tiny_target_config(**target_overrides),
        layer_ids="auto",
        draft_vocab_size=draft_vocab_size,
        num_layers=num_layers,
    )
    draft = Eagle3Draft(config)
    init_weights(draft, seed)
    with torch.no_grad():
        draft.embed_tokens.weight.normal_(generator=torch.Generator().manual_seed(seed + 1))
    return draft


# --- layer ids and config -------------------------------------------------------------------


def test_layer_ids_auto_is_vllm_default_when_distinct_and_spread_when_not():
    assert resolve_layer_ids("auto", 32) == [2, 16, 29]
    assert resolve_layer_ids("auto", 4) == [1, 2, 3]  # vLLM's default would be 2, 2, 1
    assert resolve_layer_ids("3,1,2", 4) == [1, 2, 3]


@pytest.mark.parametrize("spec", ["1,1,2", "1,2", "0,2,4", "a,b,c"])
def test_bad_layer_ids_are_refused(spec):
    with pytest.raises(ValueError):
        resolve_layer_ids(spec, 4)


def test_draft_config_carries_the_fields_vllm_reads():
    config = draft_config_from_target(tiny_target_config(), layer_ids="auto", draft_vocab_size=20)
    assert config.eagle_aux_hidden_state_layer_ids == [1, 2, 3]
    assert (config.vocab_size, config.draft_vocab_size, config.num_hidden_layers) == (50, 20, 1)
    with pytest.raises(ValueError, match="larger than the target"):
        draft_config_from_target(tiny_target_config(), layer_ids="auto", draft_vocab_size=51)


def test_parameter_names_are_the_vllm_checkpoint_names():
    names = set(tiny_draft().trainable_state_dict())
    expected = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
        f"midlayer.{n}.weight"
        for n in [
            "hidden_norm",
            "input_layernorm",
            "post_attention_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ]
    }
    assert names == expected
    draft = tiny_draft()
    assert draft.midlayer.self_attn.q_proj.in_features == 64 and draft.fc.in_features == 96
    assert not draft.embed_tokens.weight.requires_grad


# --- vocabulary -----------------------------------------------------------------------------


def test_draft_vocab_counts_only_loss_masked_tokens_and_maps_ids():
    ids = torch.tensor([7, 7, 7, 3, 3, 5, 5, 5, 5, 1])
    mask = torch.tensor([1, 1, 1, 1, 1, 0, 0, 0, 0, 1], dtype=torch.bool)  # the 5s are prompt tokens
    counts = count_tokens([(ids, mask)], 8)
    assert counts.tolist() == [0, 1, 0, 2, 0, 0, 0, 3]
    vocab = build_draft_vocab(counts, 3)
    assert vocab.used_ids.tolist() == [1, 3, 7]  # top 3 by count, sorted by id
    assert vocab.d2t.tolist() == [1, 2, 5]  # target = draft + d2t[draft]
    assert vocab.t2d.tolist() == [False, True, False, True, False, False, False, True]
    assert DraftVocab.from_d2t(vocab.d2t, 8).used_ids.tolist() == [1, 3, 7]


def test_draft_vocab_ties_go_to_lower_ids_and_bad_sizes_fail():
    counts = torch.tensor([0, 2, 2, 2, 1])
    assert build_draft_vocab(counts, 2).used_ids.tolist() == [1, 2]
    assert build_draft_vocab(counts, 5).is_full
    with pytest.raises(ValueError, match="larger than the target"):
        build_draft_vocab(counts, 6)
    with pytest.raises(ValueError, match="empty"):
        build_draft_vocab(torch.zeros(5, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        count_tokens([(torch.tensor([9]), torch.tensor([True]))], 5)


# --- TTT attention pattern ------------------------------------------------------------------

DOCS = torch.tensor([[0, 0, 0, 1, 1, 1, 1, -1]])


def attended_sets(backend: str, steps: int = 3) -> list[torch.Tensor]:
    """With zero queries every allowed key gets the same weight; one-hot values reveal which."""
    t, d = DOCS.shape[1], 32
    attend = TTTAttention(DOCS, backend=backend)
    weights = []
    for step in range(steps):
        q = torch.zeros(1, 2, t, d)
        k = torch.randn(1, 1, t, d)
        v = torch.zeros(1, 1, t, d)
        v[0, 0, torch.arange(t), step * t + torch.arange(t)] = 1.0  # key (step, slot) -> column step*T+slot
        out = attend(q, k, v)
        weights.append(out[0, 0, :, : steps * t])
    return weights


def expected_pattern(step: int, steps: int = 3) -> torch.Tensor:
    t = DOCS.shape[1]
    allowed = torch.zeros(t, steps * t, dtype=torch.bool)
    for q in range(t):
        for s in range(q + 1):
            allowed[q, s] = DOCS[0, s] == DOCS[0, q]  # step-0 keys: causal within the document
        for j in range(1, step + 1):
            allowed[q, j * t + q] = True  # the diagonal of every earlier step, and this one
    return allowed.float() / allowed.sum(-1, keepdim=True)


@pytest.mark.parametrize("backend", ["eager", "flex"])
def test_ttt_attention_pattern(backend):
    for step, got in enumerate(attended_sets(backend)):
        torch.testing.assert_close(got, expected_pattern(step), atol=1e-5, rtol=0)


def test_flex_and_eager_agree_on_random_inputs():
    torch.manual_seed(0)
    docs = torch.tensor([[0] * 50 + [1] * 60 + [2] * 18, [0] * 128])
    eager, flex = TTTAttention(docs, backend="eager"), TTTAttention(docs, backend="flex")
    for _ in range(3):
        q, k, v = torch.randn(2, 4, 128, 16), torch.randn(2, 2, 128, 16), torch.randn(2, 2, 128, 16)
        torch.testing.assert_close(flex(q, k, v), eager(q, k, v), atol=1e-4, rtol=1e-4)


def test_flex_gradients_equal_the_eager_reference(monkeypatch):
    """The flex path merges the diagonal keys into the step-0 attention through its log-sum-exp,
    so gradients flow through that log-sum-exp too. PyTorch refuses flex backward on CPU only
    because inductor has no CPU kernel for it; its reference math runs here in float64."""
    import torch.nn.attention.flex_attention as flex_module

    monkeypatch.setattr(flex_module, "_validate_device", lambda *tensors: None)
    docs = torch.tensor([[0] * 50 + [1] * 60 + [2] * 18, [0] * 128])
    grads = []
    for backend in ("eager", "flex"):
        generator = torch.Generator().manual_seed(1)
        attend = TTTAttention(docs, backend=backend)
        inputs = [
            [torch.randn(2, h, 128, 16, generator=generator, dtype=torch.float64) for h in (4, 2, 2)]
            for _ in range(3)
        ]
        weights = torch.randn(3, 16, generator=generator, dtype=torch.float64)
        for step in inputs:
            for x in step:
                x.requires_grad_(True)
        sum((attend(*step) * w).sum() for step, w in zip(inputs, weights, strict=True)).backward()
        grads.append([x.grad for step in inputs for x in step])
    for flex_grad, eager_grad in zip(*grads, strict=True):
        torch.testing.assert_close(flex_grad, eager_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_ttt_steps_equal_vllm_style_decoding_with_a_kv_cache(num_layers):
    """TTT at slot t == the draft run as vLLM runs it: a prefill over slots 0..t fed by the
    target, then one token per step at positions t+1, t+2 attending to the cache (one cache
    per decoder layer)."""

    class KVCacheAttention:
        def __init__(self):
            self.k, self.v = None, None

        def __call__(self, q, k, v):
            first = self.k is None
            self.k = k if first else torch.cat([self.k, k], 2)
            self.v = v if first else torch.cat([self.v, v], 2)
            groups = q.shape[1] // k.shape[1]
            kk, vv = self.k.repeat_interleave(groups, 1), self.v.repeat_interleave(groups, 1)
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=first)

    torch.manual_seed(1)
    draft = tiny_draft(num_layers=num_layers)
    t_len, steps = 12, 3
    ids = torch.randint(0, 50, (1, t_len))
    aux = torch.randn(1, t_len, 96)
    docs, positions = torch.zeros(1, t_len, dtype=torch.long), torch.arange(t_len)[None]

    attend = [TTTAttention(docs) for _ in range(num_layers)]
    hidden = draft.combine_hidden_states(aux)
    ttt_outputs = []
    for i in range(steps):
        shifted = torch.cat([ids[:, 1 + i :], ids.new_zeros(1, 1 + i)], 1)
        hidden = draft.step(shifted, hidden, positions + i, attend)
        ttt_outputs.append(hidden)

    for slot in [0, 4, 7]:
        cache = [KVCacheAttention() for _ in range(num_layers)]
        h = draft.step(
            ids[:, 1 : slot + 2],
            draft.combine_hidden_states(aux[:, : slot + 1]),
            positions[:, : slot + 1],
            cache,
        )
        torch.testing.assert_close(h[:, slot], ttt_outputs[0][:, slot], atol=1e-5, rtol=1e-4)
        h = h[:, -1:]
        for i in range(1, steps):
            h = draft.step(ids[:, slot + 1 + i : slot + 2 + i], h, torch.tensor([[slot + i]]), cache)
            torch.testing.assert_close(h[:, 0], ttt_outputs[i][:, slot], atol=1e-5, rtol=1e-4)


# --- loss and metrics -----------------------------------------------------------------------


def test_soft_kl_hand_computed():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # draft q = (1/4, 3/4)
    target = torch.log(torch.tensor([[0.5, 0.5]]))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert soft_kl(logits, target).item() == pytest.approx(expected, rel=1e-6)


def test_simulated_acceptance_length():
    assert simulated_acceptance_length([0.8, 0.5, 0.5]) == pytest.approx(1 + 0.8 + 0.4 + 0.2)


def test_step_masks_shift_within_documents():
    batch = TTTBatch(
        input_ids=torch.zeros(1, 8, dtype=torch.long),
        aux_hidden_states=torch.zeros(1, 8, 3),
        target_logits=torch.zeros(1, 8, 4),
        predict_mask=torch.tensor([[1, 1, 1, 1, 0, 1, 1, 0]], dtype=torch.bool),
        document_ids=torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]]),
        positions=torch.zeros(1, 8, dtype=torch.long),
    )
    in_vocab = torch.tensor([[1, 1, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    m0, m1 = step_masks(batch, in_vocab, 2)
    # step i at slot t trains on the target at t+1+i: same document, predictable, in vocabulary
    assert m0.int().tolist() == [[1, 0, 1, 0, 0, 1, 0, 0]]
    assert m1.int().tolist() == [[0, 1, 0, 0, 0, 0, 0, 0]]


def test_loss_with_a_uniform_draft_is_log_vocab_minus_target_entropy():
    """lm_head = 0 makes the draft uniform: KL = log(N) - H(p) at every counted slot."""
    torch.manual_seed(2)
    vocab = build_draft_vocab(torch.tensor([5] * 20 + [0] * 30), 20)  # draft ids = target ids 0..19
    draft = tiny_draft()
    draft.d2t.copy_(vocab.d2t)
    draft.t2d.copy_(vocab.t2d)
    with torch.no_grad():
        draft.lm_head.weight.zero_()
    t_len = 10
    target_logits = torch.randn(1, t_len, 50) * 3
    target_logits[..., 20:] -= 20.0  # the target's top-1 is inside the draft vocabulary...
    target_logits[0, 6, 45] = 100.0  # ...except at index 6: excluded
    target_logits[0, ::2, 0] += 10.0  # the target's choice is id 0 (the uniform draft's) at even indices
    batch = TTTBatch(
        input_ids=torch.randint(0, 50, (1, t_len)),
        aux_hidden_states=torch.randn(1, t_len, 96),
        target_logits=target_logits,
        predict_mask=torch.ones(1, t_len, dtype=torch.bool),
        document_ids=torch.zeros(1, t_len, dtype=torch.long),
        positions=torch.arange(t_len)[None],
    )
    loss, stats = ttt_loss(draft, batch, steps=2, decay=0.8, draft_ids=vocab.used_ids)

    p = torch.softmax(target_logits[0, :, :20], -1)
    per_index_kl = math.log(20) + (p * p.log()).sum(-1)  # index j = t+1+i
    counted = [[j for j in range(1 + i, t_len) if j != 6] for i in range(2)]
    expected = [per_index_kl[c].mean().item() for c in counted]
    assert stats.count.tolist() == [8, 7]
    assert loss.item() == pytest.approx(expected[0] + 0.8 * expected[1], rel=1e-5)
    summary = stats.summary(0.8)
    assert summary["loss"] == pytest.approx(loss.item(), rel=1e-5)
    # a uniform draft predicts id 0: correct exactly where the target's choice is 0
    choice = target_logits[0, :, :20].argmax(-1)
    assert stats.correct.tolist() == [float(sum(choice[j] == 0 for j in c)) for c in counted]
    # conditional on step 0 being right at the same slot s (index s + 1 at step 0, s + 2 at step 1)
    right = [{j - 1 - i for j in c if choice[j] == 0} for i, c in enumerate(counted)]
    assert stats.conditional_count.tolist() == [8, len({j - 2 for j in counted[1]} & right[0])]
    assert stats.conditional_correct.tolist() == [len(right[0]), len(right[0] & right[1])]
    assert stats.conditional_correct[1] > 0
    loss.backward()
    assert draft.lm_head.weight.grad.abs().sum() > 0 and draft.embed_tokens.weight.grad is None


@pytest.mark.parametrize("gather_counted", [True, False])
def test_a_stored_target_top1_gives_the_loss_of_the_full_head(gather_counted):
    """Rows that carry the target's top-1 come with its logits over the draft vocabulary's rows
    only: the same loss, metrics and gradients as the full-vocabulary logits (whose argmax the
    out-of-vocabulary mask otherwise reads)."""
    torch.manual_seed(5)
    vocab = build_draft_vocab(torch.tensor([5] * 20 + [0] * 30), 20)  # draft ids = target ids 0..19
    t_len = 24
    full = torch.randn(1, t_len, 50) * 3
    full[..., 20:] -= 20.0  # the target's top-1 is inside the draft vocabulary...
    full[0, ::3, 40] += 50.0  # ...except at every third slot
    common = dict(
        input_ids=torch.randint(0, 50, (1, t_len)),
        aux_hidden_states=torch.randn(1, t_len, 96),
        predict_mask=torch.ones(1, t_len, dtype=torch.bool),
        document_ids=torch.tensor([[0] * 10 + [1] * 14]),
        positions=torch.cat([torch.arange(10), torch.arange(14)])[None],
    )
    batches = [
        TTTBatch(target_logits=full, **common),
        TTTBatch(target_logits=full[..., vocab.used_ids], target_top1=full.argmax(-1), **common),
    ]
    results = []
    for batch in batches:
        draft = tiny_draft()
        draft.d2t.copy_(vocab.d2t)
        draft.t2d.copy_(vocab.t2d)
        loss, stats = draft(
            batch,
            loss_fn=ttt_loss,
            steps=3,
            decay=0.8,
            draft_ids=vocab.used_ids,
            gather_counted=gather_counted,
        )
        loss.backward()
        results.append((loss.detach(), stats.as_tensor(), {n: p.grad for n, p in draft.named_parameters()}))
    (full_loss, full_stats, full_grads), (loss, stats, grads) = results
    # step 0 counts slot t when t+1 is in its document and not an out-of-vocabulary top-1
    excluded = {t for t in range(t_len - 1) if (t + 1) % 3 == 0 or t == 9}
    assert full_stats[1, 0] == t_len - 1 - len(excluded)
    torch.testing.assert_close(loss, full_loss)
    torch.testing.assert_close(stats, full_stats)
    for name, grad in full_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=name)


def _loss_and_grads(batch, vocab, *, num_layers=1, freeze_lm_head=False, loss_fn=ttt_loss, **options):
    draft = tiny_draft(num_layers=num_layers)
    draft.d2t.copy_(vocab.d2t)
    draft.t2d.copy_(vocab.t2d)
    draft.lm_head.weight.requires_grad_(not freeze_lm_head)
    loss, stats = draft(batch, loss_fn=loss_fn, steps=3, decay=0.8, draft_ids=vocab.used_ids, **options)
    loss.backward()
    grads = {name: p.grad for name, p in draft.named_parameters() if p.grad is not None}
    return loss.detach(), stats.as_tensor(), grads


@pytest.mark.parametrize(("num_layers", "loss_chunk_rows"), [(1, None), (2, None), (1, 16)])
def test_the_whole_ttt_loss_compiles_to_one_graph_with_the_eager_values(num_layers, loss_chunk_rows):
    """On GPU the trainer compiles `ttt_loss` whole (`compiled_ttt_loss`). `fullgraph=True` fails
    on any graph break in the unroll, masks or loss; aot_eager runs the captured forward and
    backward graphs (inductor's CPU code is not what the GPU runs, and FlexAttention has no CPU
    backward, so the eager attention is captured here). With `loss_chunk_rows` the compiled loss
    is compared with the unchunked eager one."""
    torch.manual_seed(3)
    vocab = build_draft_vocab(torch.tensor([5] * 20 + [0] * 30), 20)
    t_len = 24
    batch = TTTBatch(
        input_ids=torch.randint(0, 50, (1, t_len)),
        aux_hidden_states=torch.randn(1, t_len, 96),
        target_logits=torch.randn(1, t_len, 50) * 3,
        predict_mask=torch.rand(1, t_len) > 0.2,
        document_ids=torch.tensor([[0] * 10 + [1] * 14]),
        positions=torch.cat([torch.arange(10), torch.arange(14)])[None],
    )
    compiled = torch.compile(ttt_loss, fullgraph=True, backend="aot_eager", dynamic=False)
    options = dict(num_layers=num_layers, gather_counted=False)
    eager_loss, eager_stats, eager_grads = _loss_and_grads(batch, vocab, **options)
    compiled_loss, compiled_stats, compiled_grads = _loss_and_grads(
        batch, vocab, loss_fn=compiled, loss_chunk_rows=loss_chunk_rows, **options
    )
    assert torch.isfinite(eager_loss) and eager_loss > 0
    torch.testing.assert_close(compiled_loss, eager_loss)
    torch.testing.assert_close(compiled_stats, eager_stats)
    assert compiled_grads.keys() == eager_grads.keys() and len(eager_grads) > 5
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, msg=name)


@pytest.mark.parametrize("gather_counted", [True, False])
@pytest.mark.parametrize("freeze_lm_head", [False, True])
def test_the_chunked_head_and_kl_give_the_loss_and_gradients_of_the_whole(gather_counted, freeze_lm_head):
    """`loss_chunk_rows` computes lm_head, the KL and their gradients a chunk of rows at a time
    (in the forward pass): the same loss, metrics and gradients as autograd over all rows at
    once, with masked slots, out-of-vocabulary top-1s and two documents in the row."""
    torch.manual_seed(6)
    vocab = build_draft_vocab(torch.tensor([5] * 20 + [0] * 30), 20)
    t_len = 24
    full = torch.randn(2, t_len, 50) * 3
    full[..., 20:] -= 20.0
    full[:, ::5, 40] += 50.0  # every fifth slot's top-1 is outside the draft vocabulary
    batch = TTTBatch(
        input_ids=torch.randint(0, 50, (2, t_len)),
        aux_hidden_states=torch.randn(2, t_len, 96),
        target_logits=full,
        predict_mask=torch.rand(2, t_len) > 0.2,
        document_ids=torch.tensor([[0] * 10 + [1] * 14, [0] * 20 + [-1] * 4]),
        positions=torch.cat([torch.arange(10), torch.arange(14)]).repeat(2, 1),
    )
    options = dict(gather_counted=gather_counted, freeze_lm_head=freeze_lm_head)
    whole_loss, whole_stats, whole_grads = _loss_and_grads(batch, vocab, **options)
    loss, stats, grads = _loss_and_grads(batch, vocab, loss_chunk_rows=5, **options)
    assert whole_stats[1].sum() > 40 and whole_loss > 0
    torch.testing.assert_close(loss, whole_loss)
    torch.testing.assert_close(stats, whole_stats)
    assert grads.keys() == whole_grads.keys() and ("lm_head.weight" in grads) != freeze_lm_head
    for name, grad in whole_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=name)

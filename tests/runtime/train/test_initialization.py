"""Warm start from an existing draft: what is copied, how lm_head rows follow the tokens, and the
errors for a checkpoint that does not fit (real tensors, tiny shapes)."""

import json

import pytest
import torch

from eagle3_runtime.export import write_eagle3_dir, write_speculators_dir
from eagle3_runtime.model.config import draft_config_from_target
from eagle3_runtime.model.draft import Eagle3Draft, init_weights
from eagle3_runtime.model.vocab import DraftVocab
from eagle3_runtime.train.initialization import warm_start
from tests.runtime.model.test_model import tiny_draft, tiny_target_config


def _source(tmp_path, used_ids, num_layers=1, seed=3, **target_overrides):
    """A draft over the target tokens `used_ids`, written as a plain eagle3 directory."""
    target = tiny_target_config(**target_overrides)
    config = draft_config_from_target(
        target, layer_ids="auto", draft_vocab_size=len(used_ids), num_layers=num_layers
    )
    draft = Eagle3Draft(config)
    init_weights(draft, seed)
    vocab = DraftVocab(torch.tensor(used_ids), target.vocab_size)
    draft.d2t.copy_(vocab.d2t)
    draft.t2d.copy_(vocab.t2d)
    out = tmp_path / f"source-{num_layers}-{len(used_ids)}-{seed}"
    write_eagle3_dir(out, draft.trainable_state_dict(), config, dtype=torch.float32)
    return out, draft


def _fresh(used_ids, num_layers=1):
    draft = tiny_draft(draft_vocab_size=len(used_ids), num_layers=num_layers)
    with torch.no_grad():
        draft.lm_head.weight.fill_(7.0)  # stands for the target's rows
    return draft, DraftVocab(torch.tensor(used_ids), 50)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_layers_are_copied_and_lm_head_rows_follow_the_tokens(tmp_path, num_layers):
    source_ids = list(range(0, 40, 2))  # 20 even tokens
    path, source = _source(tmp_path, source_ids, num_layers=num_layers)
    new_ids = list(range(10, 30))  # 20 tokens: the even ones 10..28 are shared
    draft, vocab = _fresh(new_ids, num_layers=num_layers)
    report = warm_start(draft, str(path), vocab)
    assert report == {
        "initialized_from": str(path),
        "lm_head_rows_from_checkpoint": 10,
        "lm_head_rows_from_target": 10,
    }
    for name, tensor in source.trainable_state_dict().items():
        if not name.startswith(("lm_head", "d2t", "t2d")):
            torch.testing.assert_close(draft.state_dict()[name], tensor, msg=name)
    for row, token in enumerate(new_ids):
        expected = (
            source.lm_head.weight[source_ids.index(token)] if token % 2 == 0 else torch.full((32,), 7.0)
        )
        torch.testing.assert_close(draft.lm_head.weight[row], expected, msg=f"token {token}")
    assert torch.equal(draft.d2t, vocab.d2t.new_zeros(20)), "the draft keeps its own vocabulary maps"


def test_speculators_directory_is_read_and_its_residual_convention_checked(tmp_path):
    path, source = _source(tmp_path, list(range(20)), num_layers=2)
    speculators = write_speculators_dir(
        tmp_path / "spec",
        path,
        verifier="org/target",
        speculative_tokens=3,
        architectures=["LlamaForCausalLM"],
        dtype=torch.float32,
    )
    draft, vocab = _fresh(list(range(20)), num_layers=2)
    warm_start(draft, str(speculators), vocab)
    torch.testing.assert_close(draft.layers["1"].mlp.up_proj.weight, source.layers["1"].mlp.up_proj.weight)
    torch.testing.assert_close(draft.midlayer.hidden_norm.weight, source.midlayer.hidden_norm.weight)

    config = json.loads((speculators / "config.json").read_text())
    del config["norm_before_residual"]  # vLLM's speculators default is then true
    (speculators / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="sets norm_before_residual, which this trainer does not implement"):
        warm_start(_fresh(list(range(20)), num_layers=2)[0], str(speculators), vocab)


def test_a_checkpoint_that_does_not_fit_is_refused_by_name(tmp_path):
    ids = list(range(20))
    draft, vocab = _fresh(ids)
    wider, _ = _source(tmp_path, ids, intermediate_size=96)
    with pytest.raises(
        ValueError, match=r"tensor midlayer\.mlp\.gate_proj\.weight is \[96, 32\].*\[64, 32\]"
    ):
        warm_start(draft, str(wider), vocab)

    deeper, _ = _source(tmp_path, ids, num_layers=2)
    with pytest.raises(ValueError, match=r"has 2 decoder layer\(s\), the draft being trained has 1"):
        warm_start(draft, str(deeper), vocab)

    other_layers, _ = _source(tmp_path, ids, seed=4, num_hidden_layers=8)  # auto ids: [2, 4, 5]
    with pytest.raises(ValueError, match=r"trained on target layers \[2, 4, 5\], this run uses \[1, 2, 3\]"):
        warm_start(draft, str(other_layers), vocab)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="not an eagle3 draft directory"):
        warm_start(draft, str(empty), vocab)


def test_a_head_without_layer_ids_and_with_embeddings_is_read(tmp_path):
    """Published heads may leave the layer ids to vLLM's default and carry embed_tokens: both fine."""
    from safetensors.torch import load_file, save_file

    ids = list(range(20))
    path, source = _source(tmp_path, ids)
    config = json.loads((path / "config.json").read_text())
    del config["eagle_aux_hidden_state_layer_ids"]
    (path / "config.json").write_text(json.dumps(config))
    weights = load_file(str(path / "model.safetensors"))
    save_file({**weights, "embed_tokens.weight": torch.ones(50, 32)}, str(path / "model.safetensors"))
    draft, vocab = _fresh(ids)
    embeddings = draft.embed_tokens.weight.clone()
    assert warm_start(draft, str(path), vocab)["lm_head_rows_from_checkpoint"] == 20
    torch.testing.assert_close(draft.fc.weight, source.fc.weight)
    assert torch.equal(draft.embed_tokens.weight, embeddings), "the embeddings stay the target's"

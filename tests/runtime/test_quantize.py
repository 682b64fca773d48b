"""Quark quantisation of an exported draft: format, scope, and logits close to the bf16 draft's."""

import json

import pytest
import torch
from safetensors.torch import load_file

from eagle3_runtime.cli import main as eagle3
from eagle3_runtime.export import write_eagle3_dir
from eagle3_runtime.model.attention import TTTAttention
from eagle3_runtime.quantize import dequantized_fp8_weights, load_draft
from tests.runtime.test_model import tiny_draft


def draft_logits(draft, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = 16
    ids = torch.randint(0, 50, (1, t), generator=g)
    aux = torch.randn(1, t, 96, generator=g)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(torch.randn(draft.embed_tokens.weight.shape, generator=g))
        hidden = draft.step(
            ids,
            draft.combine_hidden_states(aux),
            torch.arange(t)[None],
            TTTAttention(torch.zeros(1, t, dtype=torch.long)),
        )
        return draft.logits(hidden)


def export_trained_like(directory, num_layers=1):
    draft = tiny_draft(draft_vocab_size=20, num_layers=num_layers)
    with torch.no_grad():  # trained-like weights: larger than the 0.02 init
        for layer in [draft.midlayer, *draft.layers.values()]:
            for p in layer.parameters():
                p.mul_(10.0 if p.dim() == 2 else 1.0)
    return write_eagle3_dir(directory, draft.trainable_state_dict(), draft.config)


@pytest.fixture
def exported(tmp_path):
    return export_trained_like(tmp_path / "bf16")


def test_fp8_quantises_only_the_mid_layer_and_keeps_logits_close(exported, tmp_path, capsys):
    out = tmp_path / "fp8"
    assert (
        eagle3(
            [
                "quantize",
                "--input",
                str(exported),
                "--output",
                str(out),
                "--scheme",
                "fp8",
                "--result-file",
                str(tmp_path / "result.json"),
            ]
        )
        == 0
    )
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "quark"
    assert config["quantization_config"]["exclude"] == ["fc", "lm_head"]
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 20
    weights = load_file(str(out / "model.safetensors"))
    assert weights["midlayer.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    assert weights["midlayer.mlp.down_proj.weight_scale"].shape == (32,)  # one scale per output channel
    assert weights["fc.weight"].dtype == weights["lm_head.weight"].dtype == torch.bfloat16
    assert "d2t" in weights and "t2d" in weights

    _, reference = load_draft(exported)
    _, dequantized = load_draft(exported)
    dequantized.load_state_dict(dequantized_fp8_weights(out), strict=False)
    ref, got = draft_logits(reference), draft_logits(dequantized)
    relative = ((got - ref).norm() / ref.norm()).item()
    assert 0 < relative < 0.1, relative  # FP8 E4M3 keeps 3 mantissa bits
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_mxfp4_and_bad_input(exported, tmp_path):
    out = tmp_path / "mxfp4"
    assert eagle3(["quantize", "--input", str(exported), "--output", str(out), "--scheme", "mxfp4"]) == 0
    weights = load_file(str(out / "model.safetensors"))
    assert weights["midlayer.mlp.up_proj.weight"].dtype == torch.uint8  # two fp4 values per byte
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "quark"
    assert (
        eagle3(["quantize", "--input", str(out), "--output", str(tmp_path / "again"), "--scheme", "fp8"]) == 1
    )
    assert (
        eagle3(
            [
                "quantize",
                "--input",
                str(tmp_path / "missing"),
                "--output",
                str(tmp_path / "x"),
                "--scheme",
                "fp8",
            ]
        )
        == 1
    )


def test_fp8_keeps_every_layer_of_a_two_layer_draft(tmp_path):
    exported = export_trained_like(tmp_path / "bf16", num_layers=2)
    out = tmp_path / "fp8"
    assert eagle3(["quantize", "--input", str(exported), "--output", str(out), "--scheme", "fp8"]) == 0
    weights = load_file(str(out / "model.safetensors"))
    assert weights["layers.1.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    assert weights["layers.1.mlp.down_proj.weight_scale"].shape == (32,)
    assert weights["layers.1.input_layernorm.weight"].dtype == torch.bfloat16
    _, original = load_draft(exported)
    expected = {k for k in original.trainable_state_dict() if k not in ("d2t", "t2d")}
    assert expected <= set(weights), sorted(expected - set(weights))

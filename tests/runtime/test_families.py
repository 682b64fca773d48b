"""Target families: the weight lookup, verifier and layer-id rules each family needs,
and docs/target-families.md kept true to a measured run (eagle3_runtime/tiny_families_matrix.py)."""

from __future__ import annotations

import json

import jinja2
import pytest
import torch
from safetensors.torch import save_file
from transformers import DeepseekV3Config

from eagle3_runtime.export import verifier_architectures
from eagle3_runtime.model.config import resolve_layer_ids
from eagle3_runtime.target import TargetHead, load_target_config, load_target_embeddings
from eagle3_runtime.tiny_families import CHAT_SHAPES, FAMILIES, REASONING_FAMILIES
from eagle3_runtime.tiny_families_matrix import (
    DOC,
    PIPELINE_STAGES,
    RESULTS,
    record_stages,
    render_matrix,
    vllm_error,
)


def _render(template: str, messages, **kwargs) -> str:
    return jinja2.Environment().from_string(template).render(messages=messages, bos_token="<bos>", **kwargs)


@pytest.mark.parametrize("family", sorted(CHAT_SHAPES))
def test_each_chat_shape_keeps_the_reasoning_block_where_the_family_has_one(family):
    shape = CHAT_SHAPES[family]
    turns = [
        {"role": "user", "content": "Continue:\nx = 1"},
        {"role": "assistant", "content": "y = 2", "reasoning_content": "It counts up."},
    ]
    text = _render(shape.template, turns)
    assert "x = 1" in text and "y = 2" in text and shape.eos in text
    assert ("It counts up." in text) == (family in REASONING_FAMILIES)
    prompt = _render(shape.template, turns[:1], add_generation_prompt=True)
    without = _render(shape.template, turns[:1], add_generation_prompt=True, enable_thinking=False)
    if family in REASONING_FAMILIES and family != "gpt-oss":  # harmony has no empty-block switch
        assert without.startswith(prompt) and "</think>" in without.removeprefix(prompt)
    else:
        assert without == prompt


def _kimi_like_checkpoint(directory, *, vocab_size=96, rows=128, hidden=16):
    """A Kimi-K2.5-shaped folder: config `kimi_k25` with the DeepSeek-V3 text model under
    text_config, tensors under `language_model.*`, embedding rows padded past vocab_size."""
    text = DeepseekV3Config(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=61, tie_word_embeddings=False
    )
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text.to_dict(),
        "vision_config": {"model_type": "kimi_k25_vision"},
    }
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(0)
    tensors = {
        "language_model.model.embed_tokens.weight": torch.randn(rows, hidden, generator=g),
        "language_model.model.norm.weight": torch.rand(hidden, generator=g) + 0.5,
        "language_model.lm_head.weight": torch.randn(rows, hidden, generator=g),
        # DeepSeek-V3's MTP layer has its own embeddings: never the text model's.
        "language_model.model.layers.61.embed_tokens.weight": torch.zeros(rows, hidden),
        "vision_tower.patch_embed.proj.weight": torch.zeros(4, 4),
    }
    save_file(tensors, str(directory / "model.safetensors"))
    return tensors


def test_a_wrapped_target_is_read_from_its_language_model_tensors_with_padded_rows_cut(tmp_path):
    tensors = _kimi_like_checkpoint(tmp_path / "kimi")
    config = load_target_config(str(tmp_path / "kimi"))
    assert (config.model_type, config.vocab_size, config.num_hidden_layers) == ("deepseek_v3", 96, 61)
    embeddings = load_target_embeddings(str(tmp_path / "kimi"), config)
    assert torch.equal(embeddings, tensors["language_model.model.embed_tokens.weight"][:96])
    head = TargetHead.from_pretrained(str(tmp_path / "kimi"), config)
    assert torch.equal(head.lm_head_weight, tensors["language_model.lm_head.weight"][:96])
    assert head(torch.randn(3, 16)).shape == (3, 96)  # logits over vocab_size, not the padded rows


def test_too_few_embedding_rows_is_a_clear_error(tmp_path):
    _kimi_like_checkpoint(tmp_path / "kimi", vocab_size=200, rows=128)
    with pytest.raises(ValueError, match="has 128 rows, fewer than its config's vocab_size 200"):
        load_target_embeddings(str(tmp_path / "kimi"))


def test_the_speculators_verifier_names_the_targets_own_architecture(tmp_path):
    _kimi_like_checkpoint(tmp_path / "kimi")
    assert verifier_architectures(str(tmp_path / "kimi")) == ["KimiK25ForConditionalGeneration"]
    with pytest.raises(
        FileNotFoundError, match="cannot read the verifier no-such-org/no-such-model's config.json"
    ):
        verifier_architectures("no-such-org/no-such-model")


def test_layer_ids_of_a_deep_moe_stack_are_vllms_defaults():
    # vLLM's DeepseekV2ForCausalLM (DeepSeek-V3, Kimi-K2.5's text model) and the Qwen3-MoE and
    # gpt-oss classes take (2, L // 2, L - 3) when the draft names none.
    for layers in (61, 48, 36, 94):
        assert resolve_layer_ids("auto", layers) == [2, layers // 2, layers - 3]


def test_the_doc_is_the_matrix_of_the_recorded_run():
    results = json.loads(RESULTS.read_text())
    assert [r["family"] for r in results] == list(FAMILIES), "the run covers every family, in order"
    assert DOC.read_text() == render_matrix(results), (
        "docs/target-families.md differs from what the recorded run measured: "
        "run `python -m eagle3_runtime.tiny_families_matrix --work DIR`"
    )
    for r in results:
        if r.get("supported"):
            assert all(r["stages"][s]["ok"] for s in PIPELINE_STAGES)
            assert r["measured"]["acceptance_length"] > 1.0, r


def test_a_stage_that_raised_is_a_failure_in_the_pipelines_words_and_the_rest_not_reached(tmp_path):
    """A stage that raised wrote no result of its own: the matrix must show it failed (with the
    pipeline's message), not as "not reached" like the stages after it."""
    results_dir = tmp_path / "ws" / "results"
    results_dir.mkdir(parents=True)
    (results_dir / "generate.json").write_text(json.dumps({"stage": "generate", "ok": True}))
    (tmp_path / "result.json").write_text(
        json.dumps({"stage": "pipeline", "ok": False, "message": "RejectedRequest: HTTP 400"})
    )
    row = {"stages": {}, "measured": {}}
    record_stages(tmp_path, row)
    assert row["stages"]["generate"] == {"ok": True}
    assert row["stages"]["extract"]["ok"] is False
    assert row["stages"]["extract"]["error"] == "RejectedRequest: HTTP 400"
    assert all(row["stages"][s] == {"ok": False, "error": "not reached"} for s in PIPELINE_STAGES[2:])


def test_a_failed_assert_in_vllm_is_quoted_with_its_source_line(tmp_path):
    """A bare AssertionError says nothing; the table quotes the line that raised it and where, not
    the wrappers vLLM logs after it (lines as vLLM 0.32's CPU worker logged them for MiniMax-M2)."""
    worker = "(Worker pid=10774) ERROR 12-07 17:25:36 [multiproc_executor.py:1063] "
    site = "/venv/lib/python3.11/site-packages/vllm/model_executor/layers/fused_moe/router/cpu_router.py"
    (tmp_path / "generate-vllm.log").write_text(
        "\n".join(
            [
                worker + "Traceback (most recent call last):",
                worker + f'  File "{site}", line 239, in _compute_routing',
                worker + '    assert self.scoring_func == "softmax"',
                worker + "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
                worker + "AssertionError",
                "(EngineCore pid=10755) ERROR 12-07 17:25:36 [core.py:1512] RuntimeError: Worker failed "
                "with error '', please check the stack trace above for the root cause",
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace",
            ]
        )
        + "\n"
    )
    assert vllm_error(tmp_path) == (
        'AssertionError: assert self.scoring_func == "softmax" '
        "(vllm.model_executor.layers.fused_moe.router.cpu_router, line 239)"
    )

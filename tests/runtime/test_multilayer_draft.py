"""A two-layer draft (`eagle3 train --draft-layers 2`), trained for a number of epochs, exported in
both formats and served by real vLLM (CPU build) as the EAGLE-3 draft of the tiny target.

vLLM builds layer 0 of a multi-layer eagle3 draft over cat(embed, hidden) and the later layers
as plain decoder layers over the residual stream; a draft trained with other semantics would be
rejected by the verifier (an untrained draft measures about 1.0 here). Both exports hold the
same weights, so greedy decoding must accept the same tokens with either.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file

from eagle3_api.stage_result import StageResult
from eagle3_api.workspace import LATEST_EXPORT, Workspace
from eagle3_runtime.cli import main as eagle3
from eagle3_runtime.hidden_states import write_samples
from eagle3_runtime.model.config import resolve_layer_ids
from eagle3_runtime.target import load_target_config
from eagle3_runtime.tiny_target import ensure_tiny_target, stdlib_corpus
from tests.runtime.test_vllm_acceptance import acceptance_length, chat_prompts, on_policy_samples
from tests.support.vllm_server import running_vllm

EPOCHS, BATCH_TOKENS, SEQ_LEN = 2, 1024, 512  # kept short: CPU training under load
# Measured 2026-11-29 (load 10-14): 33 steps in 393 s, simulated acceptance 1.59 in training, 1.65 in
# vLLM with either format (per position 0.48, 0.17, 0.003); untrained drafts measure about 1.0.
MIN_ACCEPTANCE = 1.3


@pytest.mark.slow
def test_two_layer_draft_trained_in_epochs_is_served_by_vllm_in_both_formats(tmp_path):
    torch.set_num_threads(2)
    target = ensure_tiny_target()
    config = load_target_config(str(target))
    layer_ids = resolve_layer_ids("auto", config.num_hidden_layers)
    texts = stdlib_corpus(12.0)
    train_prompts = chat_prompts(64, seed=1, texts=texts[: len(texts) // 2])
    eval_prompts = chat_prompts(8, seed=2, texts=texts[len(texts) // 2 :])

    workspace = Workspace(tmp_path / "ws")
    write_samples(
        workspace.hidden_states_dir,
        on_policy_samples(target, train_prompts, layer_ids),
        layer_ids=layer_ids,
        num_hidden_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
    )
    started = time.monotonic()
    result_file = tmp_path / "train.json"
    # fmt: off
    assert eagle3([
        "train", "--workspace", str(workspace.root), "--target", str(target), "--hidden-states", "offline",
        "--draft-vocab-size", str(config.vocab_size), "--draft-layers", "2", "--epochs", str(EPOCHS),
        "--learning-rate", "3e-3", "--batch-tokens", str(BATCH_TOKENS), "--seq-len", str(SEQ_LEN),
        "--ttt-steps", "3", "--result-file", str(result_file),
    ]) == 0
    # fmt: on
    train = StageResult.parse_message(result_file.read_text())
    print(f"train: {time.monotonic() - started:.0f} s, {json.dumps(train.metrics)}")
    total = train.metrics["total_steps"]
    assert train.metrics["epochs"] == EPOCHS and train.metrics["step"] == total
    progress = json.loads((workspace.root / "progress" / "train.json").read_text())
    assert (progress["step"], progress["totalSteps"]) == (total, total)

    drafts = {fmt: tmp_path / fmt for fmt in ("eagle3", "speculators")}
    for fmt, out in drafts.items():
        # fmt: off
        assert eagle3([
            "export", "--workspace", str(workspace.root), "--checkpoint", f"step-{total:08d}",
            "--format", fmt, "--output", str(out), "--target", str(target),
        ]) == 0
        # fmt: on
    drafts = {fmt: out / LATEST_EXPORT for fmt, out in drafts.items()}
    plain = load_file(str(drafts["eagle3"] / "model.safetensors"))
    assert plain["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * config.hidden_size
    assert plain["layers.1.self_attn.q_proj.weight"].shape[1] == config.hidden_size
    assert json.loads((drafts["eagle3"] / "config.json").read_text())["num_hidden_layers"] == 2
    speculators = load_file(str(drafts["speculators"] / "model.safetensors"))
    assert {k.replace("layers.0.", "midlayer.", 1) for k in speculators} == set(plain)

    measured = {}
    for fmt, draft in drafts.items():
        spec = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3}
        with running_vllm(
            target, tmp_path, name=f"vllm-{fmt}", speculative_config=spec, max_model_len=1024
        ) as s:
            measured[fmt] = acceptance_length(s, eval_prompts)
        print(f"{fmt}: mean acceptance length {measured[fmt][0]:.2f}, per position {measured[fmt][1]}")

    assert measured["eagle3"][0] >= MIN_ACCEPTANCE, measured
    assert measured["speculators"][0] == pytest.approx(measured["eagle3"][0], abs=0.05), measured

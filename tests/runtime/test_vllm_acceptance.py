"""The test that matters: a draft trained here is accepted by real vLLM (CPU build).

Tiny target trained on local text (eagle3_runtime/tiny_target.py, cached) -> on-policy answers
from the target itself (greedy, as vLLM will decode; 128 prompts) -> hidden states of the chosen layers ->
`eagle3 train` (3 TTT steps) -> `eagle3 export` -> vLLM serving the target with the draft
(`method: eagle3`, 3 speculative tokens, greedy) on held-out prompts. The mean acceptance
length comes from vLLM's own /metrics counters. An untrained draft must score clearly lower; the
same draft quantised by `eagle3 quantize --scheme fp8` (AMD Quark) must score close to it.
"""

from __future__ import annotations

import json
import random
import time

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3_api.stage_result import StageResult
from eagle3_api.workspace import LATEST_EXPORT, Workspace
from eagle3_runtime.cli import main as eagle3
from eagle3_runtime.export import write_eagle3_dir
from eagle3_runtime.hidden_states import write_samples
from eagle3_runtime.model.config import draft_config_from_target, resolve_layer_ids
from eagle3_runtime.model.draft import Eagle3Draft, init_weights
from eagle3_runtime.target import OnlineHiddenStates, TargetHead, load_target_config
from eagle3_runtime.tiny_build import CHAT_INSTRUCTIONS
from eagle3_runtime.tiny_target import ensure_tiny_target, stdlib_corpus
from tests.support.vllm_server import running_vllm

NUM_TRAIN_PROMPTS, NUM_EVAL_PROMPTS = 128, 16
ANSWER_TOKENS, EVAL_TOKENS = 128, 128
TRAIN_STEPS, BATCH_TOKENS = 120, 2048  # about 250k token positions (about 10 epochs), 3 TTT steps each


def chat_prompts(count: int, seed: int, texts: list[str]) -> list[list[dict]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        lines = rng.choice(texts).splitlines(keepends=True)
        start = rng.randrange(max(1, len(lines) - 8))
        snippet = "".join(lines[start : start + rng.randint(2, 8)])
        prompts.append([{"role": "user", "content": f"{rng.choice(CHAT_INSTRUCTIONS)}\n{snippet}"}])
    return prompts


def on_policy_samples(target_dir, prompts, layer_ids):
    """The target's own greedy answers, with hidden states; loss only on the answers."""
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    states = OnlineHiddenStates(str(target_dir), layer_ids)
    stop = {tokenizer.eos_token_id, *model.generation_config.eos_token_id}
    for first in range(0, len(prompts), 32):
        rendered = [
            tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
            for p in prompts[first : first + 32]
        ]
        batch = tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **batch, max_new_tokens=ANSWER_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        width = batch["input_ids"].shape[1]
        for row, attention in zip(out, batch["attention_mask"], strict=True):
            prompt = row[:width][attention.bool()]
            answer = row[width:].tolist()
            cut = next((i + 1 for i, t in enumerate(answer) if t in stop), len(answer))
            ids = torch.cat([prompt, torch.tensor(answer[:cut], dtype=torch.long)])
            mask = torch.zeros(ids.shape[0], dtype=torch.bool)
            mask[prompt.shape[0] :] = True
            yield from states.samples([(ids, mask)])


def acceptance_length(server, prompts) -> tuple[float, list[float]]:
    def counters() -> dict[str, float]:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("vllm:spec_decode_num_"):
                    key = sample.name + sample.labels.get("position", "")
                    totals[key] = totals.get(key, 0.0) + sample.value
        return totals

    before = counters()
    for messages in prompts:
        response = httpx.post(
            f"{server.url}/v1/chat/completions",
            timeout=300,
            json={
                "model": server.served_model_name,
                "messages": messages,
                "max_tokens": EVAL_TOKENS,
                "temperature": 0.0,
            },
        )
        response.raise_for_status()
    after = counters()
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    drafts = delta["vllm:spec_decode_num_drafts_total"]
    assert drafts > 0, f"vLLM made no drafts: {delta}"
    per_position = [
        delta.get(f"vllm:spec_decode_num_accepted_tokens_per_pos_total{i}", 0.0) / drafts for i in range(3)
    ]
    return 1 + delta["vllm:spec_decode_num_accepted_tokens_total"] / drafts, per_position


def untrained_draft(target_dir, out_dir):
    """What the trainer starts from: random layers, lm_head = the target's output rows."""
    config = load_target_config(str(target_dir))
    draft_config = draft_config_from_target(config, layer_ids="auto", draft_vocab_size=config.vocab_size)
    draft = Eagle3Draft(draft_config)
    init_weights(draft, seed=0)
    with torch.no_grad():
        draft.lm_head.weight.copy_(TargetHead.from_pretrained(str(target_dir), config).lm_head_weight.float())
    return write_eagle3_dir(out_dir, draft.trainable_state_dict(), draft_config)


@pytest.mark.slow
def test_trained_draft_is_accepted_by_vllm(tmp_path):
    torch.set_num_threads(2)
    target = ensure_tiny_target()
    config = load_target_config(str(target))
    layer_ids = resolve_layer_ids("auto", config.num_hidden_layers)
    texts = stdlib_corpus(12.0)
    train_prompts = chat_prompts(NUM_TRAIN_PROMPTS, seed=1, texts=texts[: len(texts) // 2])
    eval_prompts = chat_prompts(NUM_EVAL_PROMPTS, seed=2, texts=texts[len(texts) // 2 :])  # held out

    workspace = Workspace(tmp_path / "ws")
    started = time.monotonic()
    manifest = write_samples(
        workspace.hidden_states_dir,
        on_policy_samples(target, train_prompts, layer_ids),
        layer_ids=layer_ids,
        num_hidden_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
    )
    print(
        f"data: {manifest.num_samples} samples, {manifest.num_tokens} tokens in {time.monotonic() - started:.0f} s"
    )

    started = time.monotonic()
    result_file = tmp_path / "train.json"
    assert (
        eagle3(
            [
                "train",
                "--workspace",
                str(workspace.root),
                "--target",
                str(target),
                "--hidden-states",
                "offline",
                "--layer-ids",
                "auto",
                "--draft-vocab-size",
                str(config.vocab_size),
                "--steps",
                str(TRAIN_STEPS),
                "--learning-rate",
                "2e-3",
                "--batch-tokens",
                str(BATCH_TOKENS),
                "--seq-len",
                "1024",
                "--ttt-steps",
                "3",
                "--loss-decay",
                "0.8",
                "--checkpoint-every",
                str(TRAIN_STEPS // 2),
                "--result-file",
                str(result_file),
            ]
        )
        == 0
    )
    train = StageResult.parse_message(result_file.read_text())
    print(f"train: {time.monotonic() - started:.0f} s, {json.dumps(train.metrics)}")
    assert [int(s) for s in train.metrics["checkpoints"]] == [TRAIN_STEPS // 2, TRAIN_STEPS]

    exported = tmp_path / "draft"
    assert (
        eagle3(
            [
                "export",
                "--workspace",
                str(workspace.root),
                "--checkpoint",
                f"step-{TRAIN_STEPS}",
                "--format",
                "eagle3",
                "--output",
                str(exported),
            ]
        )
        == 0
    )
    exported = exported / LATEST_EXPORT  # the versioned directory the export stage published
    exported_config = json.loads((exported / "config.json").read_text())
    assert exported_config["eagle_aux_hidden_state_layer_ids"] == layer_ids

    quantised = tmp_path / "draft-fp8"
    assert eagle3(["quantize", "--input", str(exported), "--output", str(quantised), "--scheme", "fp8"]) == 0
    quantised = quantised / LATEST_EXPORT

    measured = {}
    for name, draft in (
        ("trained", exported),
        ("trained-fp8", quantised),
        ("untrained", untrained_draft(target, tmp_path / "untrained")),
    ):
        spec = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3}
        with running_vllm(
            target, tmp_path, name=f"vllm-{name}", speculative_config=spec, max_model_len=1024
        ) as server:
            measured[name] = acceptance_length(server, eval_prompts)
        print(f"{name}: mean acceptance length {measured[name][0]:.2f}, per position {measured[name][1]}")

    trained, untrained = measured["trained"][0], measured["untrained"][0]
    assert trained >= 2.5, measured
    assert untrained < trained - 0.5, measured
    assert measured["trained-fp8"][0] >= trained - 0.2, measured

"""An EAGLE-3 draft that vLLM loads and runs, and that gets some tokens accepted without training.

The monitoring test needs real speculative decoding whose counters all move, accepted tokens
included; an untrained draft is almost never accepted. This one keeps the real architecture and
file format (eagle3_runtime.export) but zeroes its final norm, so its logits are all zero: vLLM's
greedy proposal is then the lowest target id in the draft vocabulary. That vocabulary starts at
the token the target itself emits most often, so the draft guesses that token at every position
and the target accepts it whenever it agrees.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from eagle3_runtime.export import write_eagle3_dir
from eagle3_runtime.model.config import draft_config_from_target, resolve_layer_ids
from eagle3_runtime.model.draft import Eagle3Draft, init_weights
from eagle3_runtime.model.vocab import DraftVocab

DRAFT_VOCAB_SIZE = 32


def greedy_outputs(target: Path, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """The token ids the target generates (greedy) after each prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            out = model.generate(
                ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            outputs.append(out[0, ids.shape[1] :].tolist())
    return outputs


def most_frequent_output_token(target: Path, prompts: list[str], max_new_tokens: int) -> int:
    """The token the target generates most often (greedy) after these prompts."""
    counts = Counter(token for output in greedy_outputs(target, prompts, max_new_tokens) for token in output)
    return counts.most_common(1)[0][0]


def build_constant_draft(target: Path, out: Path, token_id: int) -> Path:
    from transformers import AutoConfig

    target_config = AutoConfig.from_pretrained(target)
    vocab_size = target_config.vocab_size
    size = min(DRAFT_VOCAB_SIZE, vocab_size - token_id)
    layer_ids = resolve_layer_ids("auto", target_config.num_hidden_layers)
    config = draft_config_from_target(target_config, layer_ids=layer_ids, draft_vocab_size=size)
    vocab = DraftVocab(torch.arange(token_id, token_id + size, dtype=torch.int64), vocab_size)
    model = Eagle3Draft(config)
    init_weights(model, seed=0)
    with torch.no_grad():
        model.norm.weight.zero_()  # all-zero logits: the proposal is used_ids[0] == token_id
        model.d2t.copy_(vocab.d2t)
        model.t2d.copy_(vocab.t2d)
    return write_eagle3_dir(out, model.trainable_state_dict(), config)

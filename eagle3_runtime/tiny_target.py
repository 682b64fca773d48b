"""A tiny Llama target built on this machine, for tests, benchmarks and `eagle3 pipeline --preset tiny-cpu`.

Built the way eagle3_runtime/tiny_build.py describes (nothing downloaded: a BPE tokenizer and a
small `LlamaForCausalLM` trained briefly on the Python standard library's sources), on a mix of raw
source and chat-formatted "continue this code" turns, so that both `/v1/completions` and
`/v1/chat/completions` produce structured, predictable text (a random target would make draft
acceptance meaningless).

The result is an ordinary Hugging Face directory that vLLM serves, cached under
`$EAGLE3_CACHE/tiny-targets/<key>`; the key hashes RECIPE_VERSION and the build parameters.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3_runtime.tiny_build import (
    cache_key,
    cache_root,
    cached_build,
    continuation_documents,
    save_target,
    train_bpe_tokenizer,
    train_causal_lm,
    training_text,
    write_build_record,
)

# Where tests, benchmarks and eagle3_runtime.pipeline.prompts have always taken the corpus from.
from eagle3_runtime.tiny_build import stdlib_corpus as stdlib_corpus

log = logging.getLogger(__name__)

# Part of every cache key: bump it when a change alters the built target (tokens, documents,
# model, training, saved files). Version 1 builds what this module's source-hashed keys built.
RECIPE_VERSION = "1"

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
END_OF_TURN = "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [PAD, BOS, EOS, END_OF_TURN, *ROLE_TOKENS.values()]

# Each turn is `<|role|>\ncontent<|end|>\n`; generation continues after `<|assistant|>\n`
# and stops at `<|end|>` (the tokenizer's eos token).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyTargetSpec:
    """Everything that determines the built target (and so its cache key)."""

    layers: int = 4
    hidden: int = 256
    heads: int = 4
    intermediate: int = 688
    vocab_size: int = 4096
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 400
    learning_rate: float = 2e-3
    corpus_megabytes: float = 8.0
    chat_fraction: float = 0.5
    seed: int = 0


def spec_key(spec: TinyTargetSpec) -> str:
    return cache_key(f"tiny-target {RECIPE_VERSION}", spec)[:16]


def ensure_tiny_target(spec: TinyTargetSpec | None = None, **overrides) -> Path:
    """Return the directory of the tiny target for `spec`, building it once per machine.

    `overrides` are TinyTargetSpec fields, e.g. `ensure_tiny_target(layers=16, hidden=512)`.
    """
    spec = spec or TinyTargetSpec()
    if overrides:
        spec = TinyTargetSpec(**{**asdict(spec), **overrides})
    return cached_build(
        cache_root() / "tiny-targets", spec_key(spec), lambda out: build_tiny_target(spec, out)
    )


def train_tokenizer(texts: list[str], vocab_size: int):
    return train_bpe_tokenizer(
        texts,
        vocab_size,
        special_tokens=SPECIAL_TOKENS,
        bos=BOS,
        eos=END_OF_TURN,
        pad=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def training_documents(texts: list[str], chat_fraction: float, rng: random.Random) -> list[str]:
    """Raw source files, and chat turns asking to continue a snippet of one, as template-rendered text."""

    def chat(instruction: str, prompt: str, answer: str) -> str:
        return (
            f"{BOS}{ROLE_TOKENS['user']}\n{instruction}\n{prompt}{END_OF_TURN}\n"
            f"{ROLE_TOKENS['assistant']}\n{answer}{END_OF_TURN}\n"
        )

    return continuation_documents(
        texts, chat_fraction, rng, raw=lambda text: BOS + text + EOS, chat=chat, max_answer_lines=30
    )


def build_tiny_target(spec: TinyTargetSpec, out_dir: Path, train=None) -> None:
    """Build the target of `spec` into the new folder `out_dir`. `train(model, stream, spec)`
    replaces the CPU training run (benchmarks/pipeline train deeper targets on a GPU)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    started = time.monotonic()
    tokenizer, documents, stream = training_text(
        spec,
        lambda texts: train_tokenizer(texts, spec.vocab_size),
        lambda texts, _, rng: training_documents(texts, spec.chat_fraction, rng),
    )
    log.info("tiny target: %d documents, %d tokens, vocab %d", len(documents), len(stream), len(tokenizer))

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(spec.seed)  # the initial weights
    model = LlamaForCausalLM(config)
    (train or _train)(model, stream, spec)
    save_target(
        model, tokenizer, out_dir, stop_ids=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(EOS)]
    )
    write_build_record(out_dir / "tiny_target.json", spec, started)


def _train(model, stream, spec: TinyTargetSpec) -> None:
    # At most 2 threads: the machine that builds the tests' target has 2 cores.
    train_causal_lm(model, stream, spec, max_threads=2)


if __name__ == "__main__":
    # `python -m eagle3_runtime.tiny_target` builds (or finds) the default target and prints its path.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    print(ensure_tiny_target())

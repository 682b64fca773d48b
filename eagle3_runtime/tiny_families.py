"""Tiny targets of the model families users serve, built on this machine.

`eagle3_runtime/tiny_target.py` builds one tiny Llama; this module builds, the same way (a BPE
tokenizer trained on the Python standard library's sources, then brief training on raw source and
chat turns), one tiny instance per family from its Hugging Face config class:

| family | architecture | attention / MLP | chat shape |
|---|---|---|---|
| llama3 | LlamaForCausalLM | GQA / dense | Llama 3 headers, `<\\|eot_id\\|>` |
| qwen3 | Qwen3ForCausalLM | GQA + q/k norm / dense | ChatML, `<think>` blocks |
| qwen3-moe | Qwen3MoeForCausalLM | GQA + q/k norm / MoE | ChatML, `<think>` blocks |
| gpt-oss | GptOssForCausalLM | sliding + full, sinks / MoE | harmony channels (analysis, final) |
| deepseek-v3 | DeepseekV3ForCausalLM | MLA / dense then MoE | DeepSeek `<｜User｜>`, `<think>` |
| kimi-k2.5 | KimiK25ForConditionalGeneration | the deepseek-v3 text model, weights under `language_model.*` | Kimi `<\\|im_user\\|>`, `<think>` |
| minimax-m2 | MiniMaxM2ForCausalLM | GQA + q/k norm / MoE | MiniMax `]~b]`, `<think>` |

The embedding matrix is padded past the tokenizer (to a multiple of 64, as Qwen and DeepSeek
checkpoints are), so code that confuses `vocab_size` with the tokenizer's length shows up here.
Each target is cached under `$EAGLE3_CACHE/tiny-families/<family>-<key>`, the key hashing
RECIPE_VERSION and the spec; `python -m eagle3_runtime.tiny_families FAMILY` prints the folder.
The shared build steps are eagle3_runtime/tiny_build.py's.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eagle3_runtime import tiny_build

log = logging.getLogger(__name__)

VOCAB_PADDING = 64
# Part of every cache key: bump it when a change alters a built target (tokens, documents, model,
# training, saved files). Version 1 built what this module's source-hashed keys built; version 2
# gives MiniMax-M2 its `rotary_dim` and router fields, DeepSeek-V3 its own latent size, Kimi-K2.5
# what vLLM's processor reads.
RECIPE_VERSION = "2"


@dataclass(frozen=True)
class ChatShape:
    """A family's special tokens and chat template (Jinja, as tokenizer_config.json carries it)."""

    template: str
    bos: str | None
    eos: str  # ends an assistant turn: the tokenizer's eos, where generation stops
    end_of_text: str  # ends a raw document
    extra_special: tuple[str, ...]

    @property
    def special_tokens(self) -> list[str]:
        named = [t for t in (self.bos, self.eos, self.end_of_text) if t]
        return list(dict.fromkeys([*named, *self.extra_special]))


# Reasoning families render an assistant message's `reasoning_content` as the family does, and
# take `enable_thinking=false` (a chat_template_kwargs entry) to open the answer with an empty block.
_THINK = "{% if message.get('reasoning_content') %}<think>\n{{ message['reasoning_content'] }}\n</think>\n\n{% endif %}"
_NO_THINK = "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"

# Kimi-K2.5's image placeholder tokens: vLLM's processor for the wrapper looks `<|media_pad|>` up.
KIMI_MEDIA_TOKENS = ("<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>")

CHAT_SHAPES = {
    "llama3": ChatShape(
        template=(
            "{{ bos_token }}{% for message in messages %}"
            "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
        ),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        end_of_text="<|end_of_text|>",
        extra_special=("<|start_header_id|>", "<|end_header_id|>"),
    ),
    "qwen3": ChatShape(
        template=(
            "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
            "{% if message['role'] == 'assistant' %}" + _THINK + "{% endif %}"
            "{{ message['content'] + '<|im_end|>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}" + _NO_THINK + "{% endif %}"
        ),
        bos=None,
        eos="<|im_end|>",
        end_of_text="<|endoftext|>",
        extra_special=("<|im_start|>", "<think>", "</think>"),
    ),
    "gpt-oss": ChatShape(
        template=(
            "{% for message in messages %}"
            "{% if message['role'] == 'assistant' %}"
            "{% if message.get('reasoning_content') %}"
            "{{ '<|start|>assistant<|channel|>analysis<|message|>' + message['reasoning_content'] + '<|end|>' }}"
            "{% endif %}"
            "{{ '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|return|>' }}"
            "{% else %}{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"
        ),
        bos=None,
        eos="<|return|>",
        end_of_text="<|endoftext|>",
        extra_special=("<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|call|>"),
    ),
    "deepseek-v3": ChatShape(
        template=(
            "{{ bos_token }}{% for message in messages %}"
            "{% if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
            "{% elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' }}"
            + _THINK
            + "{{ message['content'] + '<｜end▁of▁sentence｜>' }}"
            "{% else %}{{ message['content'] }}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}" + _NO_THINK + "{% endif %}"
        ),
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
        end_of_text="<｜end▁of▁sentence｜>",
        extra_special=("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"),
    ),
    "kimi-k2.5": ChatShape(
        template=(
            "{% for message in messages %}"
            "{% if message['role'] == 'assistant' %}{{ '<|im_assistant|>assistant<|im_middle|>' }}"
            + _THINK
            + "{{ message['content'] + '<|im_end|>' }}"
            "{% else %}{{ '<|im_' + message['role'] + '|>' + message['role'] + '<|im_middle|>' + message['content'] + '<|im_end|>' }}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_assistant|>assistant<|im_middle|>' }}"
            + _NO_THINK
            + "{% endif %}"
        ),
        bos="[BOS]",
        eos="<|im_end|>",
        end_of_text="[EOS]",
        extra_special=(
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
            "<think>",
            "</think>",
            *KIMI_MEDIA_TOKENS,
        ),
    ),
    "minimax-m2": ChatShape(
        template=(
            "{% for message in messages %}"
            "{% set role = 'ai' if message['role'] == 'assistant' else message['role'] %}"
            "{{ ']~b]' + role + '\n' }}{% if message['role'] == 'assistant' %}" + _THINK + "{% endif %}"
            "{{ message['content'] + '[e~[\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ ']~b]ai\n' }}" + _NO_THINK + "{% endif %}"
        ),
        bos="]~!b[",
        eos="[e~[",
        end_of_text="]!d~[",
        extra_special=("]~b]", "<think>", "</think>"),
    ),
}
CHAT_SHAPES["qwen3-moe"] = CHAT_SHAPES["qwen3"]
REASONING_FAMILIES = frozenset(set(CHAT_SHAPES) - {"llama3"})


@dataclass(frozen=True)
class TinyFamilySpec:
    """What determines a built family target (and so its cache key). Sizes suit 2 CPU cores."""

    family: str
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 512
    experts: int = 4
    experts_per_token: int = 2
    expert_intermediate: int = 256
    vocab_size: int = 2048  # the tokenizer's; the embedding is padded to a multiple of VOCAB_PADDING
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 500
    learning_rate: float = 3e-3
    corpus_megabytes: float = 3.0
    chat_fraction: float = 0.6
    seed: int = 0
    max_position_embeddings: int = 2048


def _common(spec: TinyFamilySpec, vocab_size: int, ids: dict[str, Any]) -> dict[str, Any]:
    return dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        **ids,
    )


def _llama3(spec, vocab_size, ids):
    from transformers import LlamaConfig

    return LlamaConfig(**_common(spec, vocab_size, ids), head_dim=spec.head_dim, rms_norm_eps=1e-5)


def _qwen3(spec, vocab_size, ids):
    from transformers import Qwen3Config

    return Qwen3Config(**_common(spec, vocab_size, ids), head_dim=spec.head_dim)


def _qwen3_moe(spec, vocab_size, ids):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **_common(spec, vocab_size, ids),
        head_dim=spec.head_dim,
        num_experts=spec.experts,
        num_experts_per_tok=spec.experts_per_token,
        moe_intermediate_size=spec.expert_intermediate,
        norm_topk_prob=True,
    )


def _gpt_oss(spec, vocab_size, ids):
    from transformers import GptOssConfig

    config = _common(spec, vocab_size, ids)
    config["intermediate_size"] = spec.expert_intermediate  # gpt-oss has no dense MLP
    return GptOssConfig(
        **config,
        head_dim=spec.head_dim,
        num_local_experts=spec.experts,
        num_experts_per_tok=spec.experts_per_token,
        sliding_window=64,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(spec.layers)],
    )


def _deepseek_v3(spec, vocab_size, ids):
    from transformers import DeepseekV3Config

    config = _common(spec, vocab_size, ids)
    config["num_key_value_heads"] = spec.heads  # MLA: every head reads the shared latent
    return DeepseekV3Config(
        **config,
        moe_intermediate_size=spec.expert_intermediate,
        n_routed_experts=spec.experts,
        n_shared_experts=1,
        num_experts_per_tok=spec.experts_per_token,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        # The latent cache is DeepSeek-V3's own 512 + 64: vLLM's CPU MLA kernel is built for that
        # size only ("Head dimension 96 is not supported by MLA" with a smaller one).
        kv_lora_rank=512,
        q_lora_rank=96,
        qk_rope_head_dim=64,
        qk_nope_head_dim=64,
        v_head_dim=spec.head_dim,
        num_mtp_layers=0,
        # DeepSeek-V3's own config.json names its router (Hugging Face's class assumes it; vLLM
        # reads these and has no e_score_correction_bias without them).
        topk_method="noaux_tc",
        scoring_func="sigmoid",
    )


def _minimax_m2(spec, vocab_size, ids):
    from transformers import MiniMaxM2Config

    config = _common(spec, vocab_size, ids)
    config["intermediate_size"] = spec.expert_intermediate
    return MiniMaxM2Config(
        **config,
        head_dim=spec.head_dim,
        # Released MiniMax-M2 checkpoints rotate half of each head (rotary_dim 64 of head_dim 128)
        # and name it `rotary_dim`, which vLLM's MiniMaxM2 reads (and fails without).
        rotary_dim=spec.head_dim // 2,
        # Their router: sigmoid scores plus a learned bias (Hugging Face's class always routes so;
        # vLLM's reads both fields and fails without `scoring_func`).
        scoring_func="sigmoid",
        use_routing_bias=True,
        num_local_experts=spec.experts,
        num_experts_per_tok=spec.experts_per_token,
    )


@dataclass(frozen=True)
class Family:
    name: str
    text_config: Callable[[TinyFamilySpec, int, dict[str, Any]], Any]
    # The architecture vLLM serves; a wrapped family stores the text model's weights under a prefix.
    architecture: str
    wrapper: str | None = None
    # `vllm serve` flags the family needs here (target.extraArgs of its DraftTraining).
    vllm_args: tuple[str, ...] = ()
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def chat(self) -> ChatShape:
        return CHAT_SHAPES[self.name]

    @property
    def reasoning(self) -> bool:
        return self.name in REASONING_FAMILIES


FAMILIES = {
    f.name: f
    for f in (
        Family("llama3", _llama3, "LlamaForCausalLM"),
        Family("qwen3", _qwen3, "Qwen3ForCausalLM"),
        Family("qwen3-moe", _qwen3_moe, "Qwen3MoeForCausalLM"),
        Family("gpt-oss", _gpt_oss, "GptOssForCausalLM"),
        Family("deepseek-v3", _deepseek_v3, "DeepseekV3ForCausalLM"),
        # Text only: the checkpoint has no vision tower, so vLLM is told to build none.
        Family(
            "kimi-k2.5",
            _deepseek_v3,
            "KimiK25ForConditionalGeneration",
            wrapper="kimi_k25",
            vllm_args=("--language-model-only",),
        ),
        # Eager: compiled, vLLM's CPU MoE router fails with a Dynamo "data-dependent assertion"
        # error that hides which assertion; eager, the support table can quote it.
        Family("minimax-m2", _minimax_m2, "MiniMaxM2ForCausalLM", vllm_args=("--enforce-eager",)),
    )
}


def family_spec(name: str, **overrides) -> TinyFamilySpec:
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r} (known: {', '.join(FAMILIES)})")
    return TinyFamilySpec(family=name, **overrides)


def spec_key(spec: TinyFamilySpec) -> str:
    return tiny_build.cache_key(f"tiny-family {RECIPE_VERSION}", spec)[:12]


def ensure_tiny_family(name: str, spec: TinyFamilySpec | None = None) -> Path:
    """The folder of the tiny target of family `name`, built once per machine (locked, atomic)."""
    spec = spec or family_spec(name)
    if spec.family != name:
        spec = replace(spec, family=name)
    return tiny_build.cached_build(
        tiny_build.cache_root() / "tiny-families",
        f"{name}-{spec_key(spec)}",
        lambda out: build_tiny_family(spec, out),
    )


def train_family_tokenizer(texts: list[str], spec: TinyFamilySpec):
    chat = FAMILIES[spec.family].chat
    return tiny_build.train_bpe_tokenizer(
        texts,
        spec.vocab_size,
        special_tokens=chat.special_tokens,
        bos=chat.bos,
        eos=chat.eos,
        pad=chat.end_of_text,
        chat_template=chat.template,
        model_max_length=spec.max_position_embeddings,
    )


def reasoning_for(prompt: str, instruction: str) -> str:
    """A short, predictable reasoning block tied to the prompt (so the draft has something to learn)."""
    lines = [line.strip() for line in prompt.splitlines() if line.strip()]
    last = lines[-1][:48] if lines else ""
    return f"{instruction.rstrip(':?')}. The snippet ends with `{last}`, so the next lines follow it."


def training_documents(texts: list[str], spec: TinyFamilySpec, tokenizer, rng: random.Random) -> list[str]:
    """Raw source files, and chat turns (rendered with the family's template) continuing a snippet."""
    family = FAMILIES[spec.family]
    chat = family.chat

    def turn(instruction: str, prompt: str, answer: str) -> str:
        reply: dict[str, str] = {"role": "assistant", "content": answer}
        if family.reasoning and rng.random() < 0.7:  # mostly thinking, sometimes not, as served
            reply["reasoning_content"] = reasoning_for(prompt, instruction)
        messages = [{"role": "user", "content": f"{instruction}\n{prompt}"}, reply]
        return tokenizer.apply_chat_template(messages, tokenize=False)

    return tiny_build.continuation_documents(
        texts,
        spec.chat_fraction,
        rng,
        raw=lambda text: (chat.bos or "") + text + chat.end_of_text,
        chat=turn,
        max_answer_lines=24,
    )


def build_tiny_family(spec: TinyFamilySpec, out_dir: Path, device: str = "cpu") -> None:
    """Build the target of `spec` into the new folder `out_dir`, trained on `device` (on CUDA in
    bf16 autocast, with no thread cap: the GPU build of docs/target-families.md's targets)."""
    import torch
    from transformers import AutoModelForCausalLM

    started = time.monotonic()
    family = FAMILIES[spec.family]
    tokenizer, documents, stream = tiny_build.training_text(
        spec,
        lambda texts: train_family_tokenizer(texts, spec),
        lambda texts, tokenizer, rng: training_documents(texts, spec, tokenizer, rng),
    )
    padded_vocab = -(-len(tokenizer) // VOCAB_PADDING) * VOCAB_PADDING + VOCAB_PADDING
    ids = dict(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = family.text_config(spec, padded_vocab, ids)
    torch.manual_seed(spec.seed)  # the initial weights
    model = AutoModelForCausalLM.from_config(config)
    log.info(
        "tiny %s: %d documents, %d tokens, vocab %d (embedding %d)",
        spec.family,
        len(documents),
        len(stream),
        len(tokenizer),
        padded_vocab,
    )
    tiny_build.train_causal_lm(model, stream, spec, device=device, max_threads=2 if device == "cpu" else None)

    stop_ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(family.chat.end_of_text)}
    tiny_build.save_target(model, tokenizer, out_dir, stop_ids=sorted(stop_ids))
    if family.wrapper == "kimi_k25":
        _wrap_as_kimi_k25(out_dir, media_pad=tokenizer.convert_tokens_to_ids("<|media_pad|>"))
    # Off this machine's CPU: where it was trained, and on which Python's stdlib (the corpus).
    elsewhere = {"device": device, "python": platform.python_version()} if device != "cpu" else {}
    tiny_build.write_build_record(out_dir / "tiny_family.json", spec, started, **elsewhere)


# The keys of Kimi-K2.5's preprocessor_config.json that vLLM's Kimi-K2.5 image processor reads
# (MoonViT's patching); it loads them before it serves text, with or without a vision tower.
KIMI_MEDIA_PROCESSOR = {
    "patch_size": 14,
    "merge_kernel_size": [2, 2],
    "in_patch_limit": 16384,
    "patch_limit_on_one_side": 512,
    "in_patch_limit_each_frame": 4096,
    "in_patch_limit_video": None,
    "fixed_output_tokens": None,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "temporal_merge_kernel_size": 4,
}


def _wrap_as_kimi_k25(out_dir: Path, media_pad: int) -> None:
    """Re-save a DeepSeek-V3 text model the way Kimi-K2.5's checkpoint is laid out: config
    `kimi_k25` with the text model under `text_config`, weights under `language_model.*`, the
    image placeholder's id, and a preprocessor config.

    The vision tower is left out (a text-only checkpoint of the wrapper); what it changes is
    where every tool has to look for the text model's tensors and config."""
    from safetensors.torch import load_file, save_file

    text = json.loads((out_dir / "config.json").read_text())
    text.pop("architectures", None)
    text.pop("dtype", None)
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": {
            "model_type": "kimi_k25_vision",
            "hidden_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 128,
        },
        "projection_hidden_size": 64,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "media_placeholder_token_id": media_pad,
        "image_token_id": media_pad,
        **{k: text[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "preprocessor_config.json").write_text(
        json.dumps({"media_proc_cfg": KIMI_MEDIA_PROCESSOR}, indent=2)
    )
    weights = load_file(str(out_dir / "model.safetensors"))
    save_file(
        {f"language_model.{name}": t for name, t in weights.items()},
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Build tiny family targets: into the cache (prints each folder), or with --out "
        "into OUT/FAMILY, e.g. on a GPU: --out DIR --device cuda --steps 1500 --batch-size 32 --seq-len 256"
    )
    parser.add_argument("families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--out", type=Path, help="build into OUT/FAMILY instead of the cache")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (with --out)")
    overrides = ("steps", "batch_size", "seq_len", "learning_rate", "corpus_megabytes")
    for name in overrides:
        kind = float if name in ("learning_rate", "corpus_megabytes") else int
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind)
    args = parser.parse_args(argv)
    if args.device != "cpu" and not args.out:
        parser.error("--device needs --out (the cache holds CPU builds of the default specs)")
    for name in args.families:
        spec = family_spec(name, **{k: getattr(args, k) for k in overrides if getattr(args, k) is not None})
        if args.out:
            build_tiny_family(spec, args.out / name, device=args.device)
            print(args.out / name)
        else:
            print(ensure_tiny_family(name, spec))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    main()

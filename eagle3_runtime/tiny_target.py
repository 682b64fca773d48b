"""A tiny Llama target built on this machine, for tests, benchmarks and `eagle3 pipeline --preset tiny-cpu`.

Nothing can be downloaded here, so the target is made from text every machine has: the
Python standard library's own `.py` files. A byte-level BPE tokenizer is trained on them,
then a small `LlamaForCausalLM` is trained briefly on a mix of raw source and chat-formatted
"continue this code" turns, so that both `/v1/completions` and `/v1/chat/completions` produce
structured, predictable text (a random target would make draft acceptance meaningless).

The result is an ordinary Hugging Face directory that vLLM serves. It is cached under
`$EAGLE3_CACHE/tiny-targets/<key>` where the key hashes this module's source and the build
parameters; a file lock and an atomic rename let concurrent test processes share one build.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import random
import shutil
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

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
CHAT_INSTRUCTIONS = ("Continue this code:", "Complete the following Python:", "What comes next?")


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


def cache_root() -> Path:
    return Path(os.environ.get("EAGLE3_CACHE", Path.home() / ".cache" / "eagle3-operator"))


def spec_key(spec: TinyTargetSpec) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps(asdict(spec), sort_keys=True).encode())
    return digest.hexdigest()[:16]


def ensure_tiny_target(spec: TinyTargetSpec | None = None, **overrides) -> Path:
    """Return the directory of the tiny target for `spec`, building it once per machine.

    `overrides` are TinyTargetSpec fields, e.g. `ensure_tiny_target(layers=16, hidden=512)`.
    """
    spec = spec or TinyTargetSpec()
    if overrides:
        spec = TinyTargetSpec(**{**asdict(spec), **overrides})
    root = cache_root() / "tiny-targets"
    root.mkdir(parents=True, exist_ok=True)
    target = root / spec_key(spec)
    if (target / "config.json").exists():
        return target
    with open(root / f"{target.name}.lock", "w") as lock:
        # Another process may be building the same target: wait for it instead of racing.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists():
            return target
        staging = root / f".{target.name}.building-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        build_tiny_target(spec, staging)
        os.rename(staging, target)
    return target


def stdlib_corpus(megabytes: float) -> list[str]:
    """Source files of the running Python's standard library, in a fixed order, up to `megabytes`."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skipped = {"site-packages", "test", "tests", "idle_test", "lib2to3", "__pycache__"}
    texts, total, budget = [], 0, int(megabytes * 1e6)
    for path in sorted(stdlib.rglob("*.py")):
        if skipped & set(path.relative_to(stdlib).parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 200:
            continue
        texts.append(text)
        total += len(text)
        if total >= budget:
            break
    if not texts:
        raise FileNotFoundError(f"no Python sources under {stdlib} to build the tiny target from")
    return texts


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=END_OF_TURN,
        pad_token=PAD,
        additional_special_tokens=[EOS, *ROLE_TOKENS.values()],
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def training_documents(texts: list[str], chat_fraction: float, rng: random.Random) -> list[str]:
    """Raw source files, and chat turns asking to continue a snippet of one, as template-rendered text."""
    documents = []
    for text in texts:
        if rng.random() >= chat_fraction:
            documents.append(BOS + text + EOS)
            continue
        lines = text.splitlines(keepends=True)
        start = rng.randrange(max(1, len(lines) - 8))
        cut = start + rng.randint(2, 8)
        prompt = "".join(lines[start:cut])
        answer = "".join(lines[cut : cut + rng.randint(6, 30)])
        instruction = rng.choice(CHAT_INSTRUCTIONS)
        documents.append(
            f"{BOS}{ROLE_TOKENS['user']}\n{instruction}\n{prompt}{END_OF_TURN}\n"
            f"{ROLE_TOKENS['assistant']}\n{answer}{END_OF_TURN}\n"
        )
    return documents


def build_tiny_target(spec: TinyTargetSpec, out_dir: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    started = time.monotonic()
    rng = random.Random(spec.seed)
    torch.manual_seed(spec.seed)
    texts = stdlib_corpus(spec.corpus_megabytes)
    tokenizer = train_tokenizer(texts, spec.vocab_size)
    documents = training_documents(texts, spec.chat_fraction, rng)
    rng.shuffle(documents)
    stream = torch.tensor(
        [i for doc in tokenizer(documents, add_special_tokens=False)["input_ids"] for i in doc],
        dtype=torch.long,
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
    model = LlamaForCausalLM(config)
    _train(model, stream, spec)

    out_dir.mkdir(parents=True)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _write_portable_tokenizer_config(out_dir)
    stop_ids = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(EOS)]
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(out_dir)
    (out_dir / "tiny_target.json").write_text(
        json.dumps({**asdict(spec), "build_seconds": round(time.monotonic() - started, 1)}, indent=2)
    )


def _write_portable_tokenizer_config(out_dir: Path) -> None:
    """Name the classic fast-tokenizer class and embed the chat template, so readers older than
    transformers 5 (and vLLM's renderer) find both in tokenizer_config.json."""
    path = out_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    path.write_text(json.dumps(config, indent=2))


def _train(model, stream, spec: TinyTargetSpec) -> None:
    import torch

    torch.set_num_threads(min(2, torch.get_num_threads()))
    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=spec.learning_rate, weight_decay=0.01, betas=(0.9, 0.95)
    )
    warmup = max(1, spec.steps // 20)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, spec.steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    last_report = time.monotonic()
    for step in range(spec.steps):
        starts = torch.randint(0, len(stream) - spec.seq_len - 1, (spec.batch_size,), generator=generator)
        batch = torch.stack([stream[s : s + spec.seq_len] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if time.monotonic() - last_report > 30 or step == spec.steps - 1:
            last_report = time.monotonic()
            log.info("tiny target: step %d/%d loss %.3f", step + 1, spec.steps, loss.item())
    model.eval()


if __name__ == "__main__":
    # `python -m eagle3_runtime.tiny_target` builds (or finds) the default target and prints its path.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    print(ensure_tiny_target())

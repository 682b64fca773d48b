"""The build steps every locally trained target shares: eagle3_runtime/tiny_target.py's Llama,
eagle3_runtime/tiny_families.py's family instances and benchmarks/pipeline's deeper targets.

Nothing can be downloaded here, so a target is made from text every machine has (the Python
standard library's own `.py` files): a byte-level BPE tokenizer trained on it, documents that mix
raw source with "continue this code" chat turns, a brief causal-LM training run, and an ordinary
Hugging Face folder that vLLM serves, built once per machine under `cache_root()`.

A cached build's key is its builder's recipe version and its spec (`cache_key`), not its source
bytes: a change that alters what a builder produces must bump that builder's recipe version; a
refactor or a comment leaves the cache alone (re-training the tests' target costs 20 minutes of CI).
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
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

CHAT_INSTRUCTIONS = ("Continue this code:", "Complete the following Python:", "What comes next?")


class TrainingSpec(Protocol):
    """The fields of a target's spec that its training run reads."""

    seq_len: int
    batch_size: int
    steps: int
    learning_rate: float
    seed: int


def cache_root() -> Path:
    return Path(os.environ.get("EAGLE3_CACHE", Path.home() / ".cache" / "eagle3-operator"))


def cache_key(recipe: str, spec: Any) -> str:
    """A hex digest of a builder's recipe version and its spec (a dataclass)."""
    digest = hashlib.sha256(recipe.encode())
    digest.update(json.dumps(asdict(spec), sort_keys=True).encode())
    return digest.hexdigest()


def cached_build(root: Path, name: str, build: Callable[[Path], None]) -> Path:
    """`root/name`, made by `build(folder)` once per machine: locked, so concurrent test processes
    share one build, and renamed into place whole, so a half-built folder is never found."""
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    if (target / "config.json").exists():
        return target
    with open(root / f"{name}.lock", "w") as lock:
        # Another process may be building the same target: wait for it instead of racing.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists():
            return target
        staging = root / f".{name}.building-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        build(staging)
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


def train_bpe_tokenizer(
    texts: list[str],
    vocab_size: int,
    *,
    special_tokens: list[str],
    bos: str | None,
    eos: str,
    pad: str,
    chat_template: str,
    model_max_length: int,
):
    """A byte-level BPE tokenizer trained on `texts`; `special_tokens` take the first ids, in order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        additional_special_tokens=[t for t in special_tokens if t not in (bos, eos, pad)],
        model_max_length=model_max_length,
    )
    fast.chat_template = chat_template
    return fast


def continuation_documents(
    texts: list[str],
    chat_fraction: float,
    rng: random.Random,
    *,
    raw: Callable[[str], str],
    chat: Callable[[str, str, str], str],
    max_answer_lines: int,
) -> list[str]:
    """One document per source file: the file as it is (`raw(text)`) or, with probability
    `chat_fraction`, a chat turn asking to continue a snippet of it (`chat(instruction, prompt,
    answer)`, which renders it in the target's chat shape)."""
    documents = []
    for text in texts:
        if rng.random() >= chat_fraction:
            documents.append(raw(text))
            continue
        lines = text.splitlines(keepends=True)
        start = rng.randrange(max(1, len(lines) - 8))
        cut = start + rng.randint(2, 8)
        prompt = "".join(lines[start:cut])
        answer = "".join(lines[cut : cut + rng.randint(6, max_answer_lines)])
        documents.append(chat(rng.choice(CHAT_INSTRUCTIONS), prompt, answer))
    return documents


class CorpusSpec(Protocol):
    corpus_megabytes: float
    seed: int


def training_text(
    spec: CorpusSpec,
    tokenizer_for: Callable[[list[str]], Any],
    documents_for: Callable[[list[str], Any, random.Random], list[str]],
):
    """(tokenizer, shuffled documents, token stream) for a target: `tokenizer_for(texts)` trained on
    the stdlib corpus, `documents_for(texts, tokenizer, rng)` made from it, seeded by `spec.seed`."""
    import torch

    rng = random.Random(spec.seed)
    texts = stdlib_corpus(spec.corpus_megabytes)
    tokenizer = tokenizer_for(texts)
    documents = documents_for(texts, tokenizer, rng)
    rng.shuffle(documents)
    ids = tokenizer(documents, add_special_tokens=False)["input_ids"]
    stream = torch.tensor([i for doc in ids for i in doc], dtype=torch.long)
    return tokenizer, documents, stream


def train_causal_lm(
    model, stream, spec: TrainingSpec, device: str = "cpu", max_threads: int | None = None
) -> None:
    """`spec.steps` AdamW steps on random `spec.seq_len` windows of `stream` (warm-up, then cosine
    to a tenth of the learning rate); on CUDA in bf16 autocast. The model ends on the CPU, in eval."""
    import torch

    if max_threads:
        torch.set_num_threads(min(max_threads, torch.get_num_threads()))
    cuda = device == "cuda"
    generator = torch.Generator().manual_seed(spec.seed)
    model.to(device).train()
    tokens = stream.to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=spec.learning_rate,
        weight_decay=0.01,
        betas=(0.9, 0.95),
        **({"fused": True} if cuda else {}),
    )
    warmup = max(1, spec.steps // 20)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, spec.steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    last_report = time.monotonic()
    for step in range(spec.steps):
        starts = torch.randint(0, len(stream) - spec.seq_len - 1, (spec.batch_size,), generator=generator)
        batch = torch.stack([tokens[s : s + spec.seq_len] for s in starts.tolist()])
        with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if time.monotonic() - last_report > 30 or step == spec.steps - 1:
            last_report = time.monotonic()
            log.info("target training: step %d/%d loss %.3f", step + 1, spec.steps, loss.item())
    model.to("cpu").eval()


def save_target(model, tokenizer, out_dir: Path, stop_ids: list[int]) -> None:
    """The trained model (bf16 safetensors), its tokenizer and a generation config that stops at
    `stop_ids`, as a new Hugging Face folder `out_dir`."""
    import torch
    from transformers import GenerationConfig

    out_dir.mkdir(parents=True)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _write_portable_tokenizer_config(out_dir, tokenizer.chat_template)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(out_dir)


def _write_portable_tokenizer_config(out_dir: Path, chat_template: str) -> None:
    """Name the classic fast-tokenizer class and embed the chat template, so readers older than
    transformers 5 (and vLLM's renderer) find both in tokenizer_config.json."""
    path = out_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=chat_template)
    path.write_text(json.dumps(config, indent=2))


def write_build_record(path: Path, spec: Any, started: float, **extra: Any) -> None:
    """The spec a target was built from, how long the build took (`started`: time.monotonic()),
    and `extra` fields (where it was built)."""
    path.write_text(
        json.dumps({**asdict(spec), "build_seconds": round(time.monotonic() - started, 1), **extra}, indent=2)
    )

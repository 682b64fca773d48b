"""Prompt sets made from the Python standard library's sources, for the tiny-cpu preset and the tests.

Three domains, each a JSONL file: `chat-continue` and `chat-complete` (chat prompts asking to
continue a snippet / complete a function from its signature) and `completion-code` (raw code
prefixes for /v1/completions). Training and evaluation prompts come from different source files.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from eagle3_runtime.tiny_target import stdlib_corpus

DOMAINS = ("chat-continue", "chat-complete", "completion-code")


def _snippets(text: str, rng: random.Random, count: int) -> list[tuple[str, str]]:
    """(domain, prompt text) pairs cut from one source file."""
    lines = text.splitlines(keepends=True)
    defs = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]
    out = []
    for _ in range(count):
        start = rng.randrange(max(1, len(lines) - 6))
        snippet = "".join(lines[start : start + rng.randint(2, 6)])
        if snippet.strip():
            out.append(("chat-continue", f"Continue this code:\n{snippet}"))
        if defs:
            out.append(("chat-complete", f"Complete the following Python:\n{lines[rng.choice(defs)]}"))
        prefix = "".join(lines[start : start + rng.randint(3, 8)])
        if prefix.strip():
            out.append(("completion-code", prefix))
    return out


def _is_held_out(text: str, fraction: float) -> bool:
    return int(hashlib.sha256(text[:2000].encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < fraction


def write_prompt_sets(
    directory: str | Path,
    *,
    per_file: int = 3,
    held_out: float = 0.2,
    seed: int = 0,
    corpus_megabytes: float = 8.0,
) -> dict[str, Path]:
    """Write `train/<domain>.jsonl` and `eval/<domain>.jsonl`; returns {"train": dir, "eval": dir}."""
    directory = Path(directory)
    rng = random.Random(seed)
    rows: dict[tuple[str, str], list[dict]] = {}
    for text in stdlib_corpus(corpus_megabytes):
        split = "eval" if _is_held_out(text, held_out) else "train"
        for domain, prompt in _snippets(text, rng, per_file):
            rows.setdefault((split, domain), []).append({"prompt": prompt, "domain": domain})
    for (split, domain), items in rows.items():
        path = directory / split / f"{domain}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(r) + "\n" for r in items)
        # Rewrite only on change: a resumed `generate` checks its inputs have not moved.
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return {"train": directory / "train", "eval": directory / "eval"}


def mode_of(domain: str) -> str:
    return "completion" if domain.startswith("completion") else "chat"

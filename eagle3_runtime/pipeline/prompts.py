"""Prompt sets made from the Python standard library's sources, for the tiny-cpu preset and the tests.

Three domains, each a JSONL file: `chat-continue` and `chat-complete` (chat prompts asking to
continue a snippet / complete a function from its signature) and `completion-code` (raw code
prefixes for /v1/completions). Training and evaluation prompts come from different source files,
and an evaluation prompt whose code also occurs in a training file (a one-line signature such as
`def close(self):` is in many) is left out: the draft has seen the target answer it.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from eagle3_runtime.tiny_target import stdlib_corpus

DOMAINS = ("chat-continue", "chat-complete", "completion-code")
INSTRUCTIONS = {
    "chat-continue": "Continue this code:\n",
    "chat-complete": "Complete the following Python:\n",
    "completion-code": "",
}


def _snippets(text: str, rng: random.Random, count: int) -> list[tuple[str, str]]:
    """(domain, code) pairs cut from one source file; the prompt is the domain's instruction + code."""
    lines = text.splitlines(keepends=True)
    defs = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]
    out = []
    for _ in range(count):
        start = rng.randrange(max(1, len(lines) - 6))
        snippet = "".join(lines[start : start + rng.randint(2, 6)])
        if snippet.strip():
            out.append(("chat-continue", snippet))
        if defs:
            out.append(("chat-complete", lines[rng.choice(defs)]))
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
    cut: list[tuple[str, str, str]] = []  # (split, domain, code)
    training_files = []
    for text in stdlib_corpus(corpus_megabytes):
        split = "eval" if _is_held_out(text, held_out) else "train"
        if split == "train":
            training_files.append(text)
        cut += [(split, domain, code) for domain, code in _snippets(text, rng, per_file)]
    # Whole training files, not only the prompts cut from them: the check holds for a training
    # set cut with any seed.
    training_text = "\0".join(training_files)
    rows: dict[tuple[str, str], list[dict]] = {}
    seen_eval: set[str] = set()
    for split, domain, code in cut:
        prompt = INSTRUCTIONS[domain] + code
        if split == "eval":
            if prompt in seen_eval or code in training_text:
                continue
            seen_eval.add(prompt)
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

"""Conversation records (what `eagle3 generate` writes) and their tokenisation (what every
hidden-state mode and the trainer's online mode feed the target).

A record is one JSON line. `mode` says which endpoint produced it:

- `chat`: `messages` is the whole conversation, the generated assistant reply last;
- `completion`: raw text, `prompt` then the generated `completion`.

Records produced by a vLLM server also carry the exact token ids it saw and sampled
(`prompt_token_ids`, `completion_token_ids`); tokenisation then uses them as they are, so the
hidden states belong to the very tokens the target generated (on-policy). Records without
them (a dataset used as is) are tokenised here: chat through the tokenizer's chat template,
completions as `prompt + completion`.

The loss mask marks the tokens the draft learns to predict: the assistant turns (with their
end-of-turn token) of a chat, the completion of a raw completion.

A data directory holds `shard-NNNNN.jsonl` files and a `manifest.json` listing the finished ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

FORMAT = "eagle3-conversations/v1"
# Samples are cut to this many tokens in every hidden-state mode, so the modes see the same
# tokens; an extraction server needs a max model length of one more (it samples one token).
DEFAULT_MAX_LENGTH = 2047
MANIFEST = "manifest.json"
Mode = Literal["chat", "completion"]


@dataclass
class ConversationRecord:
    id: str
    mode: Mode
    domain: str = "default"
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    completion: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    finish_reason: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode == "chat" and not self.messages:
            raise ValueError(f"chat record {self.id!r} has no messages")
        if self.mode == "completion" and (self.prompt is None or self.completion is None):
            raise ValueError(f"completion record {self.id!r} needs both prompt and completion")
        if self.mode not in ("chat", "completion"):
            raise ValueError(f"record {self.id!r}: mode must be chat or completion, not {self.mode!r}")

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v not in (None, {})}, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> ConversationRecord:
        return cls(**json.loads(line))

    @property
    def num_generated_tokens(self) -> int:
        return len(self.completion_token_ids or [])


def read_data_manifest(directory: str | Path) -> dict:
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"no conversation manifest at {path}: run `eagle3 generate` first")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def iter_records(directory: str | Path) -> Iterator[ConversationRecord]:
    """Every record of the finished shards of a data directory, in order."""
    directory = Path(directory)
    for shard in read_data_manifest(directory)["shards"]:
        path = directory / shard["file"]
        with open(path, encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    yield ConversationRecord.from_json(line)
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"{path}:{line_number}: not a conversation record: {exc}") from exc


def tokenize_record(
    record: ConversationRecord, tokenizer, max_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (input_ids [T] int64, loss_mask [T] bool), cut to `max_length` tokens."""
    if record.prompt_token_ids is not None and record.completion_token_ids is not None:
        ids = list(record.prompt_token_ids) + list(record.completion_token_ids)
        mask = [False] * len(record.prompt_token_ids) + [True] * len(record.completion_token_ids)
    elif record.mode == "chat":
        ids, mask = _tokenize_chat(record.messages, tokenizer)
    else:
        prompt = tokenizer(record.prompt)["input_ids"]
        completion = tokenizer(record.completion, add_special_tokens=False)["input_ids"]
        ids, mask = prompt + completion, [False] * len(prompt) + [True] * len(completion)
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(mask, dtype=torch.bool)


def _tokenize_chat(messages: list[dict[str, str]], tokenizer) -> tuple[list[int], list[bool]]:
    """Render the chat template once, and mark the tokens inside each assistant turn.

    Each assistant turn spans from the end of the prefix rendered with a generation prompt to
    the end of the prefix that includes the turn; character offsets (not token counts of
    prefixes, which BPE merges across boundaries can change) map the spans to tokens.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the target's tokenizer has no chat template; use completion-mode records")
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        start = len(tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True))
        end = len(tokenizer.apply_chat_template(messages[: i + 1], tokenize=False))
        if text[:end] != tokenizer.apply_chat_template(messages[: i + 1], tokenize=False):
            raise ValueError("the chat template does not render conversations prefix by prefix")
        spans.append((start, end))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    # A token that merges the template's text with the reply's first characters counts as reply.
    mask = [any(begin < e and end > s for s, e in spans) for begin, end in encoded["offset_mapping"]]
    return list(encoded["input_ids"]), mask


def tokenized_records(
    records: Iterable[ConversationRecord], tokenizer, max_length: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids, loss_mask) per record, skipping those with nothing to learn."""
    for record in records:
        ids, mask = tokenize_record(record, tokenizer, max_length)
        if ids.numel() >= 2 and bool(mask.any()):
            yield ids, mask


def iter_token_records(
    directory: str | Path, target: str, max_length: int = DEFAULT_MAX_LENGTH
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids, loss_mask) of every usable record in a `generate` output directory."""
    return tokenized_records(iter_records(directory), load_tokenizer(target), max_length)


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    from eagle3_runtime.target import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model))

"""Conversation records (what `eagle3 generate` writes) and their tokenisation (what every
hidden-state mode and the trainer's online mode feed the target).

A record is one JSON line. `mode` says which endpoint produced it:

- `chat`: `messages` is the whole conversation: system, user and tool messages as the source
  had them, and the assistant turns the target generated (with their `reasoning_content` and
  `tool_calls` where it produced them); `tools` and `chat_template_kwargs` are what the
  conversation was rendered with;
- `completion`: raw text, `prompt` then the generated `completion`.

Records produced by a vLLM server also carry the exact token ids it saw and sampled: one entry
per request in `generations` (chat; each assistant turn is one request, conditioned on the
turns generated before it), or `prompt_token_ids` + `completion_token_ids` (completion).
Tokenisation then uses them as they are, so the hidden states belong to the very tokens the
target generated (on-policy). Records without them (a dataset used as is) are tokenised here:
chat through the tokenizer's chat template, completions as `prompt + completion`.

A generation's prompt usually starts with the previous generation's prompt and completion
(the template renders the history as it was generated); then both are one training sequence
with both assistant turns learned, and the record stores only the prompt's new tokens
(`tokens_from_previous` says how many it shares). Where the template renders the history
differently (Qwen3 drops the reasoning of earlier turns; a sampled tokenisation the tokenizer
would not produce), the generation starts a sequence of its own, as the target saw it.

The loss mask marks the tokens the draft learns to predict: what the target generated in each
assistant turn, up to its end-of-turn token (chat), or the completion (completion).

A data directory holds `shard-NNNNN.jsonl` files and a `manifest.json` listing the finished ones.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from eagle3_runtime.pinned_target import resolve_model_path

log = logging.getLogger(__name__)

FORMAT = "eagle3-conversations/v1"
# Sequences are cut to this many tokens in every hidden-state mode, so the modes see the same
# tokens; an extraction server needs a max model length of one more (it samples one token).
DEFAULT_MAX_LENGTH = 2047
MANIFEST = "manifest.json"
Mode = Literal["chat", "completion"]
TokenPair = tuple[list[int], list[int]]  # (prompt token ids, generated token ids)


@dataclass
class ConversationRecord:
    id: str
    mode: Mode
    domain: str = "default"
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    generations: list[dict[str, Any]] | None = None
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
        if self.generations:
            return sum(len(g["completion_token_ids"]) for g in self.generations)
        return len(self.completion_token_ids or [])


def generation_entry(previous: list[int], prompt: list[int], completion: list[int], finish_reason) -> dict:
    """One `generations` entry: the prompt stored as the tokens it adds to the longest prefix
    it shares with `previous` (the prior generation's prompt + completion)."""
    shared = 0
    for a, b in zip(previous, prompt, strict=False):
        if a != b:
            break
        shared += 1
    return {
        "tokens_from_previous": shared,
        "prompt_token_ids": prompt[shared:],
        "completion_token_ids": completion,
        "finish_reason": finish_reason,
    }


def expand_generations(generations: list[dict]) -> list[TokenPair]:
    """The full (prompt, completion) token ids of every generation of a record."""
    pairs, previous = [], []
    for entry in generations:
        prompt = previous[: entry["tokens_from_previous"]] + list(entry["prompt_token_ids"])
        pairs.append((prompt, list(entry["completion_token_ids"])))
        previous = prompt + pairs[-1][1]
    return pairs


def training_sequences(pairs: list[TokenPair]) -> list[tuple[list[int], list[bool]]]:
    """Consecutive generations whose prompts extend the sequence so far are one sequence with
    every generated span learned; any other generation starts a sequence of its own."""
    sequences: list[tuple[list[int], list[bool]]] = []
    for prompt, completion in pairs:
        if sequences and prompt[: len(sequences[-1][0])] == sequences[-1][0]:
            ids, mask = sequences[-1]
            new = prompt[len(ids) :]
        else:
            ids, mask, new = [], [], prompt
            sequences.append((ids, mask))
        ids += new + completion
        mask += [False] * len(new) + [True] * len(completion)
    return sequences


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


def record_sequences(record: ConversationRecord, tokenizer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """-> [(input_ids [T] int64, loss_mask [T] bool)], one per training sequence of the record."""
    if record.generations:
        pairs = expand_generations(record.generations)
    elif record.prompt_token_ids is not None and record.completion_token_ids is not None:
        pairs = [(list(record.prompt_token_ids), list(record.completion_token_ids))]
    elif record.mode == "chat":
        pairs = _chat_template_pairs(record, tokenizer)
    else:
        prompt = tokenizer(record.prompt)["input_ids"]
        pairs = [(prompt, tokenizer(record.completion, add_special_tokens=False)["input_ids"])]
    return [
        (torch.tensor(ids, dtype=torch.int64), torch.tensor(mask, dtype=torch.bool))
        for ids, mask in training_sequences(pairs)
    ]


def as_vllm_renders(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as vLLM's OpenAI server hands them to the chat template, so that rendering
    a record here gives the tokens the server rendered: reasoning under both names templates
    read (`reasoning_content`, `reasoning`), tool-call arguments as objects, no null content
    (vllm/renderers/chat_utils.py)."""
    rendered = []
    for message in messages:
        message = {**message, "content": message.get("content") or ""}
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if reasoning is not None:
            message["reasoning_content"] = message["reasoning"] = reasoning
        if message.get("tool_calls"):
            message["tool_calls"] = [_with_object_arguments(call) for call in message["tool_calls"]]
        rendered.append(message)
    return rendered


def _with_object_arguments(call: dict) -> dict:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError:
            arguments = {}
    function["arguments"] = arguments if isinstance(arguments, dict) else {}
    return {**call, "function": function}


def _chat_template_pairs(record: ConversationRecord, tokenizer) -> list[TokenPair]:
    """(prompt, generated) token ids of every assistant turn, rendered by the chat template.

    A turn's prompt is the conversation before it with the generation prompt; what the target
    generates is the rest of the turn's rendering up to the tokenizer's end-of-turn (eos)
    token, not the separator the template writes after it. Character offsets (not token counts
    of prefixes, which BPE merges across boundaries can change) place the boundary; a token
    that merges the template's text with the reply's first characters counts as generated.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the target's tokenizer has no chat template; use completion-mode records")
    messages = as_vllm_renders(record.messages)
    options = {"tools": record.tools, **(record.chat_template_kwargs or {})}

    def render(upto: int, add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            messages[:upto], tokenize=False, add_generation_prompt=add_generation_prompt, **options
        )

    pairs = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt, turn = render(i, True), render(i + 1, False)
        if not turn.startswith(prompt):
            raise ValueError(
                f"record {record.id}: the chat template renders assistant turn {i} differently "
                "from its generation prompt"
            )
        end = turn.rfind(tokenizer.eos_token, len(prompt)) if tokenizer.eos_token else -1
        text = turn if end < 0 else turn[: end + len(tokenizer.eos_token)]
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        first = next((t for t, (_, e) in enumerate(encoded["offset_mapping"]) if e > len(prompt)), len(ids))
        pairs.append((ids[:first], ids[first:]))
    return pairs


def tokenized_records(
    records: Iterable[ConversationRecord], tokenizer, max_length: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids, loss_mask) per training sequence, cut to `max_length` tokens, skipping (and
    reporting) those with nothing to learn within them."""
    cut = 0
    for record in records:
        sequences = record_sequences(record, tokenizer)
        if not sequences:
            log.warning("record %s (%s) has no generated turn; skipped", record.id, record.meta.get("source"))
        for number, (ids, mask) in enumerate(sequences):
            if max_length is not None and ids.numel() > max_length:
                ids, mask, cut = ids[:max_length], mask[:max_length], cut + 1
            if ids.numel() >= 2 and bool(mask.any()):
                yield ids, mask
            else:
                log.warning(
                    "record %s (%s), sequence %d: no generated token within the first %s tokens; skipped",
                    record.id,
                    record.meta.get("source", "no source"),
                    number,
                    max_length,
                )
    if cut:
        log.info("%d sequences cut at %d tokens", cut, max_length)


def iter_token_records(
    directory: str | Path, target: str, max_length: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids, loss_mask) of every usable sequence in a `generate` output directory, cut
    to `max_length` tokens (default: the length `generate` held the data to)."""
    if max_length is None:
        max_length = read_data_manifest(directory).get("max_length", DEFAULT_MAX_LENGTH)
    return tokenized_records(iter_records(directory), load_tokenizer(target), max_length)


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(model))

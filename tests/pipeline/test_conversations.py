"""Conversation records and their tokenisation (shared by extract and the trainer's online mode)."""

from __future__ import annotations

import json

import pytest

from eagle3_runtime.conversations import (
    FORMAT,
    ConversationRecord,
    iter_records,
    tokenize_record,
    tokenized_records,
)
from eagle3_runtime.tiny_target import CHAT_TEMPLATE, stdlib_corpus, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(stdlib_corpus(0.3), 600)


def _decoded(tokenizer, ids, mask):
    return "".join(tokenizer.decode([i]) for i, m in zip(ids.tolist(), mask.tolist(), strict=True) if m)


def test_chat_mask_covers_exactly_the_assistant_turns(tokenizer):
    record = ConversationRecord(
        id="c1",
        mode="chat",
        messages=[
            {"role": "user", "content": "def f(x):"},
            {"role": "assistant", "content": "    return x"},
            {"role": "user", "content": "and g?"},
            {"role": "assistant", "content": "def g(): pass"},
        ],
    )
    ids, mask = tokenize_record(record, tokenizer)
    text = tokenizer.apply_chat_template(record.messages, tokenize=False)
    assert tokenizer.decode(ids.tolist()) == text
    assert tokenizer.chat_template == CHAT_TEMPLATE
    # The learned tokens are the two replies with their end-of-turn markers, nothing of the user turns.
    learned = _decoded(tokenizer, ids, mask)
    assert "return x<|end|>" in learned and "def g(): pass<|end|>" in learned
    assert "f(x)" not in learned and "and g?" not in learned


def test_server_token_ids_are_used_verbatim(tokenizer):
    record = ConversationRecord(
        id="c2",
        mode="completion",
        prompt="a",
        completion="b",
        prompt_token_ids=[5, 6, 7],
        completion_token_ids=[8, 9],
    )
    ids, mask = tokenize_record(record, tokenizer, max_length=4)
    assert ids.tolist() == [5, 6, 7, 8]
    assert mask.tolist() == [False, False, False, True]


def test_completion_mask_and_round_trip(tmp_path, tokenizer):
    records = [
        ConversationRecord(id=f"r{i}", mode="completion", prompt="import os\n", completion=f"x = {i}\n")
        for i in range(3)
    ]
    (tmp_path / "shard-00000.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    (tmp_path / "manifest.json").write_text(
        json.dumps({"format": FORMAT, "shards": [{"file": "shard-00000.jsonl", "num_samples": 3}]})
    )
    loaded = list(iter_records(tmp_path))
    assert loaded == records
    pairs = list(tokenized_records(loaded, tokenizer))
    assert len(pairs) == 3
    ids, mask = pairs[1]
    assert _decoded(tokenizer, ids, mask) == "x = 1\n"


def test_bad_record_is_reported_with_file_and_line(tmp_path):
    (tmp_path / "shard-00000.jsonl").write_text('{"id": "a", "mode": "chat"}\n')
    (tmp_path / "manifest.json").write_text(
        json.dumps({"format": FORMAT, "shards": [{"file": "shard-00000.jsonl", "num_samples": 1}]})
    )
    with pytest.raises(ValueError, match=r"shard-00000.jsonl:1: .*no messages"):
        list(iter_records(tmp_path))

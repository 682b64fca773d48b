"""Conversation records and their tokenisation (shared by extract and the trainer's online mode)."""

from __future__ import annotations

import json
import logging

import pytest

from eagle3_runtime.conversations import (
    FORMAT,
    ConversationRecord,
    as_vllm_renders,
    expand_generations,
    generation_entry,
    iter_records,
    record_sequences,
    tokenized_records,
)
from eagle3_runtime.tiny_target import CHAT_TEMPLATE, stdlib_corpus, train_tokenizer
from tests.runtime.chat_shapes import QWEN3_STYLE_TEMPLATE


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(stdlib_corpus(0.3), 600)


@pytest.fixture
def qwen3_style_tokenizer(tokenizer):
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    yield tokenizer
    tokenizer.chat_template = CHAT_TEMPLATE


def _decoded(tokenizer, ids, mask):
    return "".join(tokenizer.decode([i]) for i, m in zip(ids.tolist(), mask.tolist(), strict=True) if m)


def test_chat_mask_covers_exactly_the_assistant_turns(tokenizer):
    record = ConversationRecord(
        id="c1",
        mode="chat",
        messages=[
            {"role": "user", "content": "def f(x):"},
            {"role": "assistant", "content": "return x"},
            {"role": "user", "content": "and g?"},
            {"role": "assistant", "content": "def g(): pass"},
        ],
    )
    [(ids, mask)] = record_sequences(record, tokenizer)
    text = tokenizer.apply_chat_template(record.messages, tokenize=False)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    # One sequence (the template renders the history as generated), cut after the last end-of-turn.
    assert tokenizer.decode(ids.tolist()) == text.removesuffix("\n")
    # The learned tokens are the two replies with their end-of-turn markers, and nothing the
    # model does not generate: not the user turns, not the newline the template writes after <|end|>.
    learned = _decoded(tokenizer, ids, mask)
    assert learned == "return x<|end|>def g(): pass<|end|>"


def test_generations_are_stored_as_new_tokens_and_merge_where_the_prompt_extends(tokenizer):
    first = ([1, 5, 9], [7, 8, 3])
    second = ([1, 5, 9, 7, 8, 3, 5, 6], [4, 3])  # the history as generated, then a new user turn
    third = ([1, 5, 9, 6], [2, 3])  # the template rendered the history differently
    entries, previous = [], []
    for prompt, completion in (first, second, third):
        entries.append(generation_entry(previous, prompt, completion, "stop"))
        previous = prompt + completion
    assert [e["tokens_from_previous"] for e in entries] == [0, 6, 3]
    assert entries[1]["prompt_token_ids"] == [5, 6] and entries[2]["prompt_token_ids"] == [6]
    assert expand_generations(entries) == [first, second, third]

    record = ConversationRecord(
        id="g", mode="chat", messages=[{"role": "user", "content": "x"}], generations=entries
    )
    assert record.num_generated_tokens == 7
    sequences = [(ids.tolist(), mask.tolist()) for ids, mask in record_sequences(record, tokenizer)]
    assert sequences == [
        ([1, 5, 9, 7, 8, 3, 5, 6, 4, 3], [False] * 3 + [True] * 3 + [False] * 2 + [True] * 2),
        ([1, 5, 9, 6, 2, 3], [False] * 4 + [True] * 2),
    ]
    assert json.loads(record.to_json())["generations"] == entries


def test_server_token_ids_are_used_verbatim(tokenizer):
    record = ConversationRecord(
        id="c2",
        mode="completion",
        prompt="a",
        completion="b",
        prompt_token_ids=[5, 6, 7],
        completion_token_ids=[8, 9],
    )
    [(ids, mask)] = tokenized_records([record], tokenizer, max_length=4)
    assert ids.tolist() == [5, 6, 7, 8]
    assert mask.tolist() == [False, False, False, True]


def test_reasoning_and_tool_turns_render_as_a_qwen3_template_does(qwen3_style_tokenizer):
    tokenizer = qwen3_style_tokenizer
    tools = [
        {"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": None}}
    ]
    call = {
        "id": "call-1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "oslo"}'},
    }
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "ask the tool", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny.", "reasoning_content": "the tool said so"},
        {"role": "user", "content": "and tomorrow?"},
        {"role": "assistant", "content": "No idea.", "reasoning_content": "no tool for that"},
    ]
    record = ConversationRecord(id="q", mode="chat", messages=messages, tools=tools)
    sequences = record_sequences(record, tokenizer)
    # The tool loop within the first question is rendered as generated (one sequence, both turns
    # learned); the last question's prompt drops the earlier reasoning, so it is a sequence of its own.
    assert len(sequences) == 2
    learned = [_decoded(tokenizer, ids, mask) for ids, mask in sequences]
    assert learned[0] == (
        '<think>\nask the tool\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "oslo"}}\n'
        "</tool_call><|end|><think>\nthe tool said so\n</think>\n\nIt is sunny.<|end|>"
    )
    assert learned[1] == "<think>\nno tool for that\n</think>\n\nNo idea.<|end|>"
    second_prompt = tokenizer.decode(sequences[1][0][~sequences[1][1]].tolist())
    assert "ask the tool" not in second_prompt and "<tool_response>\nsunny\n</tool_response>" in second_prompt
    assert '"name": "get_weather"' in second_prompt  # the tools' schemas are in the system turn


def test_chat_template_kwargs_reach_the_template(qwen3_style_tokenizer):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    record = ConversationRecord(
        id="k", mode="chat", messages=messages, chat_template_kwargs={"enable_thinking": False}
    )
    [(ids, mask)] = record_sequences(record, qwen3_style_tokenizer)
    assert qwen3_style_tokenizer.decode(ids[~mask].tolist()).endswith(
        "<|assistant|>\n<think>\n\n</think>\n\n"
    )


def test_messages_are_rendered_as_vllm_hands_them_to_the_template():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    rendered = as_vllm_renders(
        [{"role": "assistant", "content": None, "reasoning": "r", "tool_calls": [call]}]
    )
    assert rendered == [
        {
            "role": "assistant",
            "content": "",
            "reasoning": "r",
            "reasoning_content": "r",
            "tool_calls": [{**call, "function": {"name": "f", "arguments": {"a": 1}}}],
        }
    ]


def test_sequences_without_a_learnable_token_are_reported(tokenizer, caplog):
    records = [
        ConversationRecord(
            id=f"r{i}",
            mode="completion",
            prompt="p",
            completion="c",
            prompt_token_ids=list(range(prompt_length)),
            completion_token_ids=[7, 8],
            meta={"source": f"prompts.jsonl:{i + 1}"},
        )
        for i, prompt_length in enumerate((3, 6))
    ]
    with caplog.at_level(logging.WARNING, logger="eagle3_runtime.conversations"):
        pairs = list(tokenized_records(records, tokenizer, max_length=5))
    assert [ids.tolist() for ids, _ in pairs] == [[0, 1, 2, 7, 8]]
    assert (
        "record r1 (prompts.jsonl:2), sequence 0: no generated token within the first 5 tokens" in caplog.text
    )


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

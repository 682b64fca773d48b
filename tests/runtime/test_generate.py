"""`eagle3 generate` against a real vLLM server: multi-turn regeneration, mixing, resume after
kill, retries, bad rows, the long-sample policy."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_api.stage_result import StageResult
from eagle3_runtime.conversations import (
    expand_generations,
    iter_records,
    iter_token_records,
    load_tokenizer,
    record_sequences,
)
from eagle3_runtime.tiny_target import END_OF_TURN, stdlib_corpus
from tests.runtime.conftest import SERVED_NAME
from tests.runtime.flaky_proxy import FlakyProxy

pytestmark = pytest.mark.slow


def _prompts(directory: Path) -> tuple[Path, Path]:
    chat = directory / "chat.jsonl"
    conversations = [
        [
            {"role": "user", "content": f"Continue this code:\ndef f{i}(x):\n"},
            {"role": "assistant", "content": "the source's reply, regenerated"},
            {"role": "user", "content": f"Complete the following Python:\nclass C{i}:\n"},
        ]
        for i in range(30)
    ]
    chat.write_text("".join(json.dumps({"messages": messages}) + "\n" for messages in conversations))
    raw = directory / "raw.jsonl"
    raw.write_text("".join(json.dumps({"text": f"import os\n\nclass C{i}:\n"}) + "\n" for i in range(30)))
    return chat, raw


def _generate(workspace: Path, server: str, sources: list[str], *extra: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "eagle3_runtime.cli", "generate", "--workspace", str(workspace),
        # Greedy, as the tiny-cpu preset generates: at the CLI's default temperature (0.7, the CRD's) the
        # tiny target samples special tokens and token splits, whose records the checks below cannot
        # compare with the messages' text.
        "--server", server, "--model", SERVED_NAME, "--max-tokens", "24", "--temperature", "0",
        "--result-file", str(workspace / "result.json"),
        *[arg for source in sources for arg in ("--source", source)], *extra,
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _result(workspace: Path) -> StageResult:
    return StageResult.parse_message((workspace / "result.json").read_text())


def _done_lines(data: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in data.glob("shard-*.jsonl*"))


def test_generate_mixes_sources_and_resumes_after_kill(tmp_path, target_server, tiny_target):
    chat, raw = _prompts(tmp_path)
    sources = [f"{chat},mode=chat,weight=3", f"{raw},mode=completion,prompt-field=text,domain=raw"]
    args = ("--num-samples", "48", "--concurrency", "2", "--samples-per-shard", "8", "--seed", "7")
    workspace = tmp_path / "ws"
    first = _generate(workspace, target_server.url, sources, *args)
    deadline = time.monotonic() + 300
    while _done_lines(workspace / "data") < 12 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, f"generate ended before it could be killed:\n{first.stdout.read()}"
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    data = workspace / "data"
    before = {}
    for path in data.glob("shard-*.jsonl*"):
        for line in path.read_text().splitlines():
            before[json.loads(line)["id"]] = line
    assert 12 <= len(before) < 48 and not (data / "manifest.json").exists()

    second = _generate(workspace, target_server.url, sources, *args)
    output = second.communicate(timeout=600)[0]
    assert second.returncode == 0, output
    result = _result(workspace)
    assert result.ok and result.metrics["samples"] == 48, result
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["resumed"] == len(before)

    records = list(iter_records(data))
    ids = [r.id for r in records]
    assert ids == [f"{i:08d}" for i in range(48)], "every sample exactly once, in order"
    by_id = {r.id: r for r in records}
    for sample_id, line in before.items():
        assert by_id[sample_id].to_json() == line, "samples finished before the kill are kept as they were"
    assert not list(data.glob("*.partial"))
    modes = {r.mode for r in records}
    assert modes == {"chat", "completion"}
    chats = sum(r.mode == "chat" for r in records)
    assert 24 <= chats <= 46, f"weight 3:1 should give mostly chat samples, got {chats}/48"
    tokenizer = load_tokenizer(str(tiny_target))
    for record in records:
        if record.mode == "chat":
            _check_regenerated_conversation(record, tokenizer)
        else:
            assert record.completion_token_ids and record.prompt_token_ids
            assert record.domain == "raw" and record.prompt.startswith("import os")

    # A finished stage is a no-op that reports the same numbers.
    again = _generate(workspace, target_server.url, sources, *args)
    assert again.wait(timeout=120) == 0
    assert _result(workspace).metrics["samples"] == 48


def _check_regenerated_conversation(record, tokenizer) -> None:
    """Both assistant turns were generated in order, each on the conversation generated before it,
    and the record holds what the target saw and produced."""
    assert [m["role"] for m in record.messages] == ["user", "assistant", "user", "assistant"]
    assert "the source's reply, regenerated" not in json.dumps(record.messages)
    pairs = expand_generations(record.generations)
    for turn, (prompt, completion) in zip((1, 3), pairs, strict=True):
        # The target's prompt is the record's conversation before the turn, as the template renders it ...
        rendered = tokenizer.apply_chat_template(
            record.messages[:turn], add_generation_prompt=True, tokenize=False
        )
        assert prompt == tokenizer(rendered, add_special_tokens=False)["input_ids"]
        # ... and the record keeps the text the target generated.
        assert tokenizer.decode(completion).removesuffix(END_OF_TURN) == record.messages[turn]["content"]
    # The template renders the history as it was generated: one sequence, both turns learned.
    [(ids, mask)] = record_sequences(record, tokenizer)
    assert ids[mask].tolist() == pairs[0][1] + pairs[1][1]
    # Rendering the messages without the token ids gives the same tokens, except the end-of-turn
    # token the template writes after a reply cut at --max-tokens, which the target never sampled.
    [(rendered_ids, rendered_mask)] = record_sequences(
        dataclasses.replace(record, generations=None), tokenizer
    )
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    unsampled = [g["finish_reason"] == "length" for g in record.generations]
    expected_ids = ids.tolist() + [end_of_turn] * unsampled[1]
    assert rendered_ids.tolist() == expected_ids
    sampled_mask = mask.tolist() + [True] * unsampled[1]
    differing = [
        i for i, (a, b) in enumerate(zip(rendered_mask.tolist(), sampled_mask, strict=True)) if a != b
    ]
    cut_ends = [len(pairs[0][0]) + len(pairs[0][1])] if unsampled[0] else []
    assert differing == cut_ends, "the masks differ only at the unsampled end-of-turn token"


def test_generate_retries_server_errors(tmp_path, target_server):
    chat, _ = _prompts(tmp_path)
    with FlakyProxy(target_server.url, failures=[429, 500, 503, 502]) as proxy:
        process = _generate(
            tmp_path / "ws", proxy.url, [str(chat)], "--num-samples", "5", "--concurrency", "1"
        )
        output = process.communicate(timeout=600)[0]
    assert process.returncode == 0, output
    # Five conversations of two turns each: ten requests after the four refused ones.
    assert proxy.served[:4] == [429, 500, 503, 502] and proxy.served[4:] == [200] * 10
    assert _result(tmp_path / "ws").metrics["samples"] == 5
    assert "retry" in output


def test_generate_reports_malformed_rows(tmp_path, target_server):
    source = tmp_path / "prompts.jsonl"
    source.write_text(
        '{"prompt": "def a():"}\n{"prompt": "def b():"\n{"prompt": 3}\n{"prompt": "def c():"}\n'
    )

    refused = _generate(
        tmp_path / "strict", target_server.url, [str(source)], "--num-samples", "2", "--on-bad-row", "fail"
    )
    output = refused.communicate(timeout=300)[0]
    assert refused.returncode == 1
    result = _result(tmp_path / "strict")
    assert not result.ok and f"{source}:2: invalid JSON" in result.message, result.message
    assert f"{source}:2" in output

    skipped = _generate(tmp_path / "lenient", target_server.url, [str(source)], "--num-samples", "3")
    output = skipped.communicate(timeout=300)[0]
    assert skipped.returncode == 0, output
    result = _result(tmp_path / "lenient")
    assert result.metrics["bad_rows"] == 2 and result.metrics["samples"] == 3
    bad = [
        json.loads(line)
        for line in (tmp_path / "lenient" / "data" / "bad-rows.jsonl").read_text().splitlines()
    ]
    assert [b["location"] for b in bad] == [f"{source}:2", f"{source}:3"]
    assert "holds a prompt" in bad[1]["reason"]


def test_long_samples_are_cut_or_skipped_and_listed(tmp_path, target_server, tiny_target):
    code = "".join(stdlib_corpus(0.2))
    source = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": "def a():"},  # fits
        {
            "messages": [
                {"role": "user", "content": "def f(x):"},
                {"role": "assistant", "content": "old"},
                {"role": "user", "content": "and g?"},
            ]
        },  # the second turn crosses the limit
        {"prompt": f"Continue this code:\n{code[:400]}"},  # the prompt alone fills the limit
        {"prompt": code[:12_000]},  # longer than the server's context: vLLM refuses it
    ]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = ("--num-samples", "4", "--max-length", "48", "--concurrency", "1")

    truncate = _generate(tmp_path / "truncate", target_server.url, [str(source)], *args)
    output = truncate.communicate(timeout=600)[0]
    assert truncate.returncode == 0, output
    result = _result(tmp_path / "truncate")
    assert result.metrics["samples"] == 2, result
    assert result.metrics["long_samples_truncated"] == 1 and result.metrics["long_samples_skipped"] == 2
    data = tmp_path / "truncate" / "data"
    listed = {
        e["location"]: e for e in map(json.loads, (data / "long-samples.jsonl").read_text().splitlines())
    }
    assert sorted(listed) == [f"{source}:2", f"{source}:3", f"{source}:4"]
    assert listed[f"{source}:2"]["action"] == "truncated" and "turn 2" in listed[f"{source}:2"]["reason"]
    assert (
        listed[f"{source}:3"]["action"] == "skipped"
        and "nothing left to learn" in listed[f"{source}:3"]["reason"]
    )
    assert (
        listed[f"{source}:4"]["action"] == "skipped"
        and "refused the prompt" in listed[f"{source}:4"]["reason"]
    )
    assert "maximum context length" in listed[f"{source}:4"]["reason"]
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["max_length"] == 48 and manifest["long_samples"] == "truncate"
    # Extraction and training cut at the length generate held the data to: the cut sample keeps
    # its first turn whole and the start of its second.
    sequences = list(iter_token_records(data, str(tiny_target)))
    assert len(sequences) == 2 and max(len(ids) for ids, _ in sequences) == 48
    [cut] = [r for r in iter_records(data) if r.meta["source"] == f"{source}:2"]
    assert len(cut.generations) == 2 and "cut at 48 tokens" in cut.meta["truncated"]

    skip = _generate(tmp_path / "skip", target_server.url, [str(source)], *args, "--long-samples", "skip")
    output = skip.communicate(timeout=600)[0]
    assert skip.returncode == 0, output
    result = _result(tmp_path / "skip")
    assert result.metrics["samples"] == 1, result
    assert result.metrics["long_samples_skipped"] == 3 and result.metrics["long_samples_truncated"] == 0
    assert "3 long samples" in result.message

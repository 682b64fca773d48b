"""`eagle3 generate` against a real vLLM server: mixing, resume after kill, retries, bad rows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_runtime.conversations import iter_records
from eagle3_runtime.layout import StageResult
from tests.pipeline.conftest import SERVED_NAME
from tests.pipeline.flaky_proxy import FlakyProxy

pytestmark = pytest.mark.slow


def _prompts(directory: Path) -> tuple[Path, Path]:
    chat = directory / "chat.jsonl"
    chat.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"Continue this code:\ndef f{i}(x):\n"}]})
            + "\n"
            for i in range(30)
        )
    )
    raw = directory / "raw.jsonl"
    raw.write_text("".join(json.dumps({"text": f"import os\n\nclass C{i}:\n"}) + "\n" for i in range(30)))
    return chat, raw


def _generate(workspace: Path, server: str, sources: list[str], *extra: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "eagle3_runtime.cli", "generate", "--workspace", str(workspace),
        "--server", server, "--model", SERVED_NAME, "--max-tokens", "24",
        "--result-file", str(workspace / "result.json"),
        *[arg for source in sources for arg in ("--source", source)], *extra,
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _result(workspace: Path) -> StageResult:
    return StageResult.parse_message((workspace / "result.json").read_text())


def _done_lines(data: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in data.glob("shard-*.jsonl*"))


def test_generate_mixes_sources_and_resumes_after_kill(tmp_path, target_server):
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
    for record in records:
        assert record.completion_token_ids and record.prompt_token_ids
        if record.mode == "chat":
            assert record.messages[-1]["role"] == "assistant"
        else:
            assert record.domain == "raw" and record.prompt.startswith("import os")

    # A finished stage is a no-op that reports the same numbers.
    again = _generate(workspace, target_server.url, sources, *args)
    assert again.wait(timeout=120) == 0
    assert _result(workspace).metrics["samples"] == 48


def test_generate_retries_server_errors(tmp_path, target_server):
    chat, _ = _prompts(tmp_path)
    with FlakyProxy(target_server.url, failures=[429, 500, 503, 502]) as proxy:
        process = _generate(
            tmp_path / "ws", proxy.url, [str(chat)], "--num-samples", "5", "--concurrency", "1"
        )
        output = process.communicate(timeout=600)[0]
    assert process.returncode == 0, output
    assert proxy.served[:4] == [429, 500, 503, 502] and proxy.served[4:] == [200] * 5
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

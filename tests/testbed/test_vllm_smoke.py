"""vLLM's CPU build really serves the locally built tiny target: chat completion and /metrics."""

from __future__ import annotations

import httpx
import pytest

from eagle3_runtime.tiny_target import ensure_tiny_target
from tests.support.vllm_server import running_vllm


@pytest.mark.slow
def test_tiny_target_serves_chat_and_metrics(tmp_path):
    target = ensure_tiny_target()
    with running_vllm(target, tmp_path, served_model_name="tiny", compiled=True) as server:
        reply = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "Continue this code:\ndef main():\n"}],
                "max_tokens": 32,
                "temperature": 0,
            },
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["choices"][0]["message"]["content"], body
        assert body["usage"]["completion_tokens"] > 0

        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        generated = [
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("vllm:generation_tokens_total{")
        ]
        assert generated and sum(generated) >= body["usage"]["completion_tokens"], metrics[:2000]
    # Stopped: nothing answers on the port any more.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.url}/health", timeout=5)

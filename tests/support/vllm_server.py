"""The one way tests start a real vLLM CPU server (built on the runtime's own launcher).

    with running_vllm(model_dir, tmp_path) as server:
        httpx.post(f"{server.url}/v1/chat/completions", ...)

The server's log lands in the test's directory; when the test body fails, its tail is printed
so the pytest report shows what vLLM said.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from eagle3_runtime.vllm_server import VLLMServer, log_tail


@contextmanager
def running_vllm(
    model: str | os.PathLike[str], log_dir: str | os.PathLike[str], *, name: str = "vllm", **server_options
) -> Iterator[VLLMServer]:
    """Start vLLM on `model`, yield it once /health answers, stop its whole process group after.

    `server_options` are VLLMServer's keyword arguments (speculative_config, max_model_len, extra_args, env).
    """
    log_path = Path(log_dir) / f"{name}.log"
    server = VLLMServer(model, log_path=log_path, **server_options)
    server.start()
    try:
        yield server
    except BaseException:
        print(f"--- tail of {log_path} ---\n{log_tail(log_path)}", file=sys.stderr)
        raise
    finally:
        server.stop()


class Load(threading.Thread):
    """Greedy completions to a vLLM server, one after another, until stopped (vLLM counts speculative
    decoding per step, so its counters move throughout)."""

    def __init__(self, url: str, model: str, prompts: list[str], max_tokens: int):
        super().__init__(daemon=True)
        self.url, self.model, self.prompts, self.max_tokens = url, model, prompts, max_tokens
        self.stop = threading.Event()
        self.completed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=120) as client:
                while not self.stop.is_set():
                    prompt = self.prompts[self.completed % len(self.prompts)]
                    body = {
                        "model": self.model,
                        "prompt": prompt,
                        "max_tokens": self.max_tokens,
                        "temperature": 0,
                    }
                    client.post(f"{self.url}/v1/completions", json=body).raise_for_status()
                    self.completed += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc

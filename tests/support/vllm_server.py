"""The one way tests start a real vLLM CPU server (built on the runtime's own launcher).

    with running_vllm(model_dir, tmp_path) as server:
        httpx.post(f"{server.url}/v1/chat/completions", ...)

The server's log lands in the test's directory; when the test body fails, its tail is printed
so the pytest report shows what vLLM said.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from eagle3_runtime.vllm_server import VLLMServer, log_tail

# vLLM's default compiles the model with torch.compile: about 30 s more per start on 2 cores, even
# with its compile cache warm, for a tiny model whose decoding it barely speeds up. Tests run it
# eager (`--enforce-eager`, as users do on CPU: examples/drafttraining-tiny-cpu.yaml) unless they
# ask for the compiled path (tests/testbed/test_vllm_smoke.py keeps it tested).
EAGER = "--enforce-eager"


@contextmanager
def running_vllm(
    model: str | os.PathLike[str],
    log_dir: str | os.PathLike[str],
    *,
    name: str = "vllm",
    compiled: bool = False,
    extra_args: Sequence[str] = (),
    **server_options,
) -> Iterator[VLLMServer]:
    """Start vLLM on `model`, yield it once /health answers, stop its whole process group after.

    `server_options` are VLLMServer's keyword arguments (speculative_config, max_model_len, env);
    `compiled` keeps vLLM's torch.compile (EAGER above).
    """
    log_path = Path(log_dir) / f"{name}.log"
    extra_args = [*extra_args] if compiled else [*extra_args, EAGER]
    server = VLLMServer(model, log_path=log_path, extra_args=extra_args, **server_options)
    server.start()
    try:
        yield server
    except BaseException:
        print(f"--- tail of {log_path} ---\n{log_tail(log_path)}", file=sys.stderr)
        raise
    finally:
        server.stop()

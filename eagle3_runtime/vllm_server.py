"""Start and stop a local vLLM OpenAI server: for `eagle3 pipeline` / `evaluate` and for the tests.

The server runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of
the CPU build looks up the wrong distribution name), in its own process group so that stopping it
also stops its engine-core workers. Its output goes to a log file whose tail is shown when it fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from eagle3_runtime.command_line import flags

log = logging.getLogger(__name__)

# Defaults for vLLM's CPU build; a GPU build ignores them.
CPU_ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


def _terminate_with_parent() -> None:
    """Runs in the child before exec: ask Linux for SIGTERM when the launching process dies,
    so a killed pipeline or test never leaves a server behind."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class VLLMServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def add_vllm_arg_argument(parser: argparse.ArgumentParser, servers: str) -> None:
    """`--vllm-arg`, repeatable: appended to the command line of the vLLM servers a stage starts,
    so that they run the target as it is served (tensor parallelism, quantization, extraArgs)."""
    parser.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="ARG",
        help=f"an argument for {servers}, as the target is served (repeatable; --vllm-arg=--enforce-eager)",
    )


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class VLLMServer:
    """One vLLM server process; use as a context manager or call start()/stop().

    `speculative_config` is passed as `--speculative-config` JSON (e.g. an eagle3 draft);
    `extra_args` are appended to the command line verbatim.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        log_path: str | os.PathLike[str],
        served_model_name: str | None = None,
        max_model_len: int = 1024,
        dtype: str = "bfloat16",
        speculative_config: dict | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 900.0,
        host: str = "127.0.0.1",
        port: int | None = None,
    ):
        self.model = str(model)
        self.served_model_name = served_model_name or self.model
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.startup_timeout_s = startup_timeout_s
        options = {
            "--model": self.model,
            "--served-model-name": self.served_model_name,
            "--host": host,
            "--port": self.port,
            "--dtype": dtype,
            "--max-model-len": max_model_len,
            "--speculative-config": json.dumps(speculative_config) if speculative_config else None,
        }
        self.command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            *flags(options),
            *extra_args,
        ]
        self.env = {**CPU_ENV_DEFAULTS, **os.environ, **(env or {})}
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, wait: bool = True) -> VLLMServer:
        """Launch the server; with `wait`, return once it is healthy (else call wait_ready()).

        Launch from a thread that outlives the server: Linux sends the parent-death signal when
        the launching thread exits."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting vLLM on %s (log %s)", self.url, self.log_path)
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"$ {' '.join(self.command)}\n".encode())
            log_file.flush()
            self._process = subprocess.Popen(
                self.command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # own process group: stop() reaches the engine workers too
                preexec_fn=_terminate_with_parent,
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        """Block until the launched server is healthy; stop it if it does not get there."""
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        started = time.monotonic()
        while True:
            code = self._process.poll()
            if code is not None:
                raise VLLMServerError(
                    f"vLLM exited with code {code} during start-up; log {self.log_path}:\n{log_tail(self.log_path)}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    log.info("vLLM ready on %s after %.0f s", self.url, time.monotonic() - started)
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > self.startup_timeout_s:
                raise VLLMServerError(
                    f"vLLM not healthy after {self.startup_timeout_s:.0f} s; log {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            time.sleep(2)

    def stop(self, grace_s: float = 30.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        # The group may outlive its leader (engine-core workers); make sure none is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

"""A real HTTP server in front of vLLM that fails the first requests, then forwards them.

Used to show that `eagle3 generate` retries 429/5xx answers: the failures are real HTTP
responses on a real socket, not a patched client. `rewrite` edits each forwarded JSON body
(the tests use it to give a tiny target's output a model family's shape).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


class FlakyProxy:
    """Answers the first POSTs with `failures` (status codes) in turn, then proxies to `upstream`."""

    def __init__(self, upstream: str, failures: list[int], rewrite: Callable[[dict], dict] | None = None):
        self.upstream = upstream.rstrip("/")
        self.failures = list(failures)
        self.rewrite = rewrite
        self.served: list[int] = []  # status of every POST answered, in order
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with proxy._lock:
                    failure = proxy.failures.pop(0) if proxy.failures else None
                if failure is not None:
                    payload = b'{"error": "injected failure"}'
                    self.send_response(failure)
                    if failure == 429:
                        self.send_header("retry-after", "0")
                else:
                    if proxy.rewrite:
                        body = json.dumps(proxy.rewrite(json.loads(body))).encode()
                    answer = httpx.post(
                        proxy.upstream + self.path,
                        content=body,
                        headers={"content-type": "application/json"},
                        timeout=300,
                    )
                    payload, failure = answer.content, answer.status_code
                    self.send_response(answer.status_code)
                with proxy._lock:
                    proxy.served.append(failure)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FlakyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()

"""Live acceptance through a Prometheus (spec.liveAcceptance.prometheusUrl) reads what the pods' own
/metrics pages say.

A real Prometheus scrapes two stand-in "pods": HTTP endpoints serving fixed pages in vLLM's
exposition format (the real vLLM pages are read in test_serving_realnode.py), with the labels the
chart's monitors attach (namespace, specdecodedeployment, pod). The operator's Prometheus reader
must give, per pod, the counters that parsing the page directly gives.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from eagle3_operator.reconcile.live_acceptance import PodCounters, parse_metrics
from eagle3_operator.reconciler import read_prometheus_counters

from tests.monitoring.prometheus import Prometheus
from tests.support.cluster import wait_until

PAGES = {
    "chat-a": (0, 120, 95, 1800, (60, 35)),
    "chat-b": (1, 40, 10, 640, (9, 1)),
}


def vllm_page(engine: int, drafts: int, accepted: int, generated: int, per_position: tuple[int, ...]) -> str:
    labels = f'engine="{engine}",model_name="m"'
    lines = [
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}.0",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}.0",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        *(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {n}.0'
            for i, n in enumerate(per_position)
        ),
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {generated}.0",
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def serving(page: str) -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_prometheus_reader_gives_each_pods_counters(tmp_path):
    pages = {pod: vllm_page(*values) for pod, values in PAGES.items()}
    with (
        serving(pages["chat-a"]) as port_a,
        serving(pages["chat-b"]) as port_b,
        # A pod of another SpecDecodeDeployment in the same namespace: not ours.
        serving(vllm_page(0, 999, 999, 999, (999,))) as port_other,
    ):
        targets = [
            (port_a, {"namespace": "ml", "specdecodedeployment": "chat", "pod": "chat-a"}),
            (port_b, {"namespace": "ml", "specdecodedeployment": "chat", "pod": "chat-b"}),
            (port_other, {"namespace": "ml", "specdecodedeployment": "other", "pod": "other-0"}),
        ]
        scrape_configs = [
            {
                "job_name": f"vllm-{labels['pod']}",
                "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": labels}],
            }
            for port, labels in targets
        ]
        with Prometheus(tmp_path, scrape_configs, {"groups": []}) as prom:
            jobs = [config["job_name"] for config in scrape_configs]
            wait_until(lambda: prom.targets_up(jobs), timeout=30, what="the stand-in pods scraped")
            read = wait_until(
                lambda: (
                    (
                        found := read_prometheus_counters(
                            prom.url, "ml", "chat", {"chat-a", "chat-b", "chat-c"}
                        )
                    )
                    and len(found) == 2
                    and found
                ),
                timeout=30,
                what="both pods' counters in Prometheus",
            )
    assert read == {pod: parse_metrics(page) for pod, page in pages.items()}
    assert read["chat-a"] == PodCounters(120, 95, 1800, (60, 35))

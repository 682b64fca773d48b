"""`eagle3 sweep` on real vLLM (CPU build): the tiny target with an untrained draft (acceptance does
not matter here, only that every K is really served and measured) at K = 0 (off), 1 and 2, at
concurrencies 1 and 4, one ABBA pair each, a few short prompts; then a schedule that the operator
renders for `numSpeculativeTokens: auto` is served by vLLM (its own untrained draft, so it runs alone too).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from eagle3_api.sweep_schedule import k_at, validate_schedule
from eagle3_runtime.cli import build_parser
from eagle3_runtime.evaluate.counters import parse_spec_counters
from eagle3_runtime.evaluate.rounds import BASELINE, CANDIDATE, abba_order
from eagle3_runtime.evaluate.sweep import scheduled_per_concurrency
from eagle3_runtime.pipeline.prompts import write_prompt_sets
from eagle3_runtime.stages import sweep
from eagle3_runtime.vllm_server import log_tail
from tests.runtime.test_vllm_acceptance import untrained_draft
from tests.support.vllm_server import EAGER, running_vllm

KMAX, LADDER = 2, [1, 4]


@pytest.fixture(scope="module")
def swept(tmp_path_factory, tiny_target):
    tmp = tmp_path_factory.mktemp("sweep")
    draft = untrained_draft(tiny_target, tmp / "draft")
    prompts = write_prompt_sets(tmp / "prompts", corpus_megabytes=1.0)["eval"]
    argv = ["sweep", "--workspace", str(tmp / "ws"), "--target", str(tiny_target), "--checkpoint", str(draft),
            "--prompts", f"{prompts / 'completion-code.jsonl'},mode=completion", "--max-speculative-tokens",
            str(KMAX), "--concurrency", *map(str, LADDER), "--rounds", "1", "--prompts-per-domain", "4",
            "--max-tokens", "16", f"--vllm-arg={EAGER}", "--result-file", str(tmp / "r.json")]  # fmt: skip
    try:
        result = sweep.run(build_parser(argv).parse_args(argv))
    except BaseException:
        for log in sorted((tmp / "ws" / "logs").glob("*.log")):
            print(f"--- tail of {log} ---\n{log_tail(log)}")
        raise
    return result, json.loads((tmp / "ws" / result.artifacts["sweep"]).read_text())


@pytest.mark.slow
def test_sweep_measures_every_k_against_the_baseline_beside_it(swept):
    result, record = swept
    measured = {(m["num_speculative_tokens"], m["concurrency"]): m for m in record["measurements"]}
    assert sorted(measured) == [(k, c) for k in range(1, KMAX + 1) for c in LADDER]
    for (k, c), m in measured.items():
        # Each K at each concurrency: its own ABBA rounds against the no-speculation server.
        assert [r["side"] for r in m["rounds"]] == abba_order(1) == [CANDIDATE, BASELINE]
        assert all(r["tokens"] > 0 and len(r["load_average"]) == 3 for r in m["rounds"])
        assert m["drafts"] > 0, f"K={k} c={c}: the candidate server made no drafts"
        assert len(m["acceptance_per_position"]) == k
        assert m["speedup"] == pytest.approx(
            m["tokens_per_second"] / m["baseline_tokens_per_second"], rel=0.01
        )
    for best in record["best"]:
        at_c = [m for m in measured.values() if m["concurrency"] == best["concurrency"]]
        fastest = max(at_c, key=lambda m: m["speedup"])
        expected = fastest["num_speculative_tokens"] if fastest["speedup"] > 1.0 else 0
        assert best["num_speculative_tokens"] == expected, (best, at_c)
    schedule = validate_schedule(record["schedule"])
    assert record["scheduled"] == scheduled_per_concurrency(record["measurements"])
    assert [k_at(schedule, s["concurrency"]) for s in record["scheduled"]] == [
        s["num_speculative_tokens"] for s in record["scheduled"]
    ]
    assert record["num_speculative_tokens"] == max(1, *(k for _, _, k in schedule))
    assert result.metrics["schedule"] == record["schedule"]


def _spec_counters(url: str):
    return parse_spec_counters(httpx.get(f"{url}/metrics", timeout=30).text)


def _requests_at_once(url: str, concurrency: int) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            # Long enough that the requests overlap even when a loaded machine staggers their arrival.
            body = {"model": "tiny", "max_tokens": 256, "temperature": 0, "ignore_eos": True}
            responses = await asyncio.gather(
                *(
                    client.post("/v1/completions", json=body | {"prompt": f"def f{i}(x):"})
                    for i in range(concurrency)
                )
            )
            assert all(r.status_code == 200 for r in responses), [r.text for r in responses]

    asyncio.run(run())


def _drafts_while_running_together(url: str, concurrency: int):
    """The counter deltas from the moment all `concurrency` streamed requests have their first token
    (all admitted, so every later step schedules them together until they end) to their end. Sent at
    once, requests may still be admitted one after another when the server's front end is slow, and
    then run at batch size 1: that would measure the machine, not the schedule."""

    async def run():
        started = asyncio.Barrier(concurrency + 1)

        async def stream(client: httpx.AsyncClient, i: int) -> None:
            body = {"model": "tiny", "max_tokens": 256, "temperature": 0, "ignore_eos": True, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body | {"prompt": f"def f{i}(x):"}) as r:
                assert r.status_code == 200, await r.aread()
                lines = r.aiter_lines()
                while not (await anext(lines)).startswith("data: "):
                    pass
                await started.wait()
                async for _ in lines:
                    pass

        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            requests = asyncio.gather(*(stream(client, i) for i in range(concurrency)))
            await started.wait()
            before = await asyncio.to_thread(_spec_counters, url)
            await requests
            return await asyncio.to_thread(_spec_counters, url) - before

    return asyncio.run(run())


@pytest.mark.slow
def test_vllm_serves_the_schedule_the_operator_renders_for_auto(tiny_target, tmp_path):
    """vLLM 0.32 (CPU) takes num_speculative_tokens_per_batch_size for eagle3, and K = 0 in a
    range turns speculation off there: speculation at batch size 1, none at 4."""
    from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

    from tests.operator import fakes

    draft = untrained_draft(tiny_target, tmp_path / "draft")
    # A schedule that shows both sides (the untrained draft's own sweep turns speculation off everywhere).
    schedule = [[1, 1, 2], [2, 64, 0]]
    body = fakes.spec_decode(
        numSpeculativeTokens="auto", draft={"model": "pvc://drafts/d", "speculationSchedule": schedule}
    )
    deployment = next(
        o for o in plan_serving(body, ServingObserved(now=fakes.NOW)).sync if o["kind"] == "Deployment"
    )
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert (
        config["num_speculative_tokens_per_batch_size"] == schedule and config["num_speculative_tokens"] == 2
    )
    with running_vllm(
        tiny_target,
        tmp_path,
        speculative_config=config | {"model": str(draft)},
        served_model_name="tiny",
    ) as server:
        _requests_at_once(server.url, 1)  # warm-up: compilation
        before = _spec_counters(server.url)
        _requests_at_once(server.url, 1)
        alone = _spec_counters(server.url) - before
        together = _drafts_while_running_together(server.url, 4)
    assert alone.drafts >= 64 and alone.draft_tokens == 2 * alone.drafts, alone
    # Four requests as long as that one would make four times its drafts at K > 0; only steps with
    # one request left (batch size 1: a staggered end) may still speculate.
    assert together.drafts <= alone.drafts, (together, alone)

"""The speculation schedule: best K per concurrency -> vLLM's num_speculative_tokens_per_batch_size,
checked by vLLM's own rules and read back the way vLLM reads it; and what `eagle3 sweep` refuses."""

from __future__ import annotations

import json

import pytest

from eagle3_api.sweep_schedule import k_at, max_k, schedule_from_best, validate_schedule
from eagle3_runtime.cli import build_parser
from eagle3_runtime.evaluate.sweep import best_per_concurrency, decide, scheduled_per_concurrency
from eagle3_runtime.stages import sweep


def test_best_k_per_concurrency_becomes_ranges_split_at_the_geometric_middle():
    best = {1: 4, 2: 4, 4: 3, 8: 0, 16: 0}
    schedule = schedule_from_best(best)
    # 1 and 2 merge (same K); 4 covers 3..5 (sqrt(2*4) = 2.8, sqrt(4*8) = 5.7); 8 and 16 merge.
    assert schedule == [[1, 2, 4], [3, 5, 3], [6, 16, 0]]
    assert all(k_at(schedule, c) == k for c, k in best.items())
    assert k_at(schedule, 500) == 0, "vLLM carries the last range's K past its end"
    assert max_k(schedule) == 4


def test_a_ladder_not_starting_at_one_still_covers_batch_size_one():
    assert schedule_from_best({4: 2, 16: 1}) == [[1, 8, 2], [9, 16, 1]]
    assert schedule_from_best({1: 0}) == [[1, 1, 0]]
    assert max_k([[1, 1, 0]]) == 1, "vLLM needs num_speculative_tokens >= 1 even when the schedule is all off"


def test_a_gap_carries_the_k_before_it():
    assert [k_at([[1, 2, 3], [8, 9, 1]], b) for b in range(1, 11)] == [3, 3, 3, 3, 3, 3, 3, 1, 1, 1]


@pytest.mark.parametrize(
    ("schedule", "error"),
    [
        ([], "at least one"),
        ([[1, 4]], "is not"),
        ([[2, 4, 1]], "start at batch size 1"),
        ([[1, 4, 2], [4, 8, 1]], "must not overlap"),
        ([[5, 8, 1], [1, 4, 2]], "sorted"),
        ([[1, 0, 1]], "first <= last"),
        ([[1, 4, -1]], "K must be >= 0"),
    ],
)
def test_schedules_vllm_would_refuse_are_refused(schedule, error):
    with pytest.raises(ValueError, match=error):
        validate_schedule(schedule)


def _m(k: int, c: int, speedup: float) -> dict:
    return {"num_speculative_tokens": k, "concurrency": c, "speedup": speedup}


def test_best_k_is_the_fastest_against_its_own_baseline_and_off_when_none_is_faster():
    measured = [_m(1, 1, 1.3), _m(2, 1, 1.6), _m(3, 1, 1.5), _m(1, 8, 0.98), _m(2, 8, 0.9), _m(3, 8, None)]
    assert best_per_concurrency(measured) == [
        {"concurrency": 1, "num_speculative_tokens": 2, "speedup": 1.6},
        {"concurrency": 8, "num_speculative_tokens": 0, "speedup": 1.0},
    ]


def _ks(scheduled: list[dict]) -> list[int]:
    return [s["num_speculative_tokens"] for s in scheduled]


def test_the_schedule_borrows_the_neighbours_windows_where_one_concurrency_flips():
    # The deep target's sweep (benchmarks/pipeline/results/2026-12-02-sweep-speedup-deep.json),
    # K = 3..5: each concurrency's argmax flips 4, 5, 3, 5, 3 between K's equal within its noise.
    speedups = {
        1: (1.625, 2.019, 1.834),
        2: (1.677, 2.016, 2.136),
        4: (1.891, 1.885, 1.729),
        8: (1.583, 1.738, 1.811),
        16: (1.430, 1.403, 1.400),
    }
    measured = [_m(k, c, s) for c, row in speedups.items() for k, s in zip((3, 4, 5), row, strict=True)]
    assert _ks(best_per_concurrency(measured)) == [4, 5, 3, 5, 3]
    scheduled = scheduled_per_concurrency(measured)
    assert _ks(scheduled) == [4, 4, 4, 4, 4]
    # Weights 1-2-1: at 4, K = 4 scores (2.016 + 2 * 1.885 + 1.738) / 4; at the ladder's ends, 2-1.
    assert scheduled[2]["smoothed_speedup"] == pytest.approx((2.016 + 2 * 1.885 + 1.738) / 4, abs=1e-4)
    assert scheduled[0]["smoothed_speedup"] == pytest.approx((2 * 2.019 + 2.016) / 3, abs=1e-4)
    assert decide(measured)["schedule"] == [[1, 16, 4]]


def test_a_larger_batch_never_gets_a_larger_k_and_off_stays_off():
    # Alone, 16 would take K = 3 (smoothed 1.2 against K = 2's 1.13): capped at 8's K = 2.
    measured = [_m(2, 4, 1.5), _m(3, 4, 1.3), _m(2, 8, 1.2), _m(3, 8, 1.1), _m(2, 16, 1.1), _m(3, 16, 1.25)]
    assert _ks(scheduled_per_concurrency(measured)) == [2, 2, 2]
    # No K beats the baseline at 8 once smoothed: off there, and off above it, whatever 16 measured.
    measured = [_m(1, 4, 1.3), _m(1, 8, 0.7), _m(1, 16, 1.2)]
    assert _ks(scheduled_per_concurrency(measured)) == [1, 0, 0]
    assert decide(measured)["schedule"] == [[1, 5, 1], [6, 16, 0]]


def test_a_tie_takes_the_smaller_k_and_an_unmeasured_k_is_not_chosen():
    assert _ks(scheduled_per_concurrency([_m(2, 1, 1.5), _m(3, 1, 1.5)])) == [2]
    # K = 3 has no speedup at 2 (the server failed there): 2 chooses among what it measured.
    measured = [_m(2, 1, 1.4), _m(3, 1, 1.6), _m(2, 2, 1.3), _m(3, 2, None)]
    assert _ks(scheduled_per_concurrency(measured)) == [3, 2]


def test_a_domain_with_fewer_prompts_than_the_top_concurrency_is_refused_before_any_server_starts(tmp_path):
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text("{}")
    prompts = tmp_path / "code.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}():"}) + "\n" for i in range(3)))
    argv = ["sweep", "--workspace", str(tmp_path / "ws"), "--target", "unused", "--checkpoint", str(tmp_path / "draft"),
            "--prompts", f"{prompts},mode=completion", "--concurrency", "1", "4"]  # fmt: skip
    with pytest.raises(
        ValueError, match=r"prompt domains \{'code': 3\} have fewer prompts than the largest concurrency 4"
    ):
        sweep.run(build_parser(argv).parse_args(argv))

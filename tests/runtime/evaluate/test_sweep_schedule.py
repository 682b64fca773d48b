"""The speculation schedule: best K per concurrency -> vLLM's num_speculative_tokens_per_batch_size,
checked by vLLM's own rules and read back the way vLLM reads it; and what `eagle3 sweep` refuses."""

from __future__ import annotations

import json

import pytest

from eagle3_api.sweep_schedule import k_at, max_k, schedule_from_best, validate_schedule
from eagle3_runtime.cli import build_parser
from eagle3_runtime.evaluate.sweep import best_per_concurrency
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

"""The speculation schedule: which number of speculative tokens K to use at which batch size.

Its shape is vLLM's own `num_speculative_tokens_per_batch_size` (vllm#32374, in the pinned 0.32):
a list of `[first batch size, last batch size, K]`, ranges sorted, not overlapping, the first one
starting at 1; K = 0 turns speculation off for that range. vLLM carries a range's K forward over a
gap and past the last range, and caps every K at `num_speculative_tokens`, so a schedule is served
with `num_speculative_tokens` = its largest K.

Contract, not runtime: the schedule is API data (a DraftTraining's `status.sweep.schedule`): the
sweep stage builds it, and the operator checks it and serves it to vLLM, by the same rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Schedule = list[list[int]]


def validate_schedule(schedule: Sequence[Sequence[int]]) -> Schedule:
    """The schedule as a list of [first, last, K] ints; ValueError (vLLM's own rules) when it is not one."""
    if not schedule:
        raise ValueError("a speculation schedule needs at least one [first, last, K] range")
    ranges = []
    for entry in schedule:
        if len(entry) != 3:
            raise ValueError(f"schedule range {list(entry)} is not [first batch size, last batch size, K]")
        first, last, k = (int(x) for x in entry)
        if not 1 <= first <= last:
            raise ValueError(f"schedule range {[first, last, k]}: need 1 <= first <= last")
        if k < 0:
            raise ValueError(f"schedule range {[first, last, k]}: K must be >= 0 (0 turns speculation off)")
        ranges.append([first, last, k])
    if ranges != sorted(ranges) or any(b[0] <= a[1] for a, b in zip(ranges, ranges[1:], strict=False)):
        raise ValueError(f"schedule {ranges}: ranges must be sorted and must not overlap")
    if ranges[0][0] != 1:
        raise ValueError(f"schedule {ranges}: the first range must start at batch size 1")
    return ranges


def schedule_from_best(best_k: Mapping[int, int]) -> Schedule:
    """The schedule from the best K measured at each concurrency of a ladder.

    A measured concurrency c_i covers the batch sizes up to the geometric middle between it and the
    next one (ladders are geometric: 1, 2, 4, ...), the first range starts at 1 and the last one is
    carried on by vLLM; neighbouring ranges with the same K are merged."""
    ladder = sorted(best_k)
    if not ladder or ladder[0] < 1:
        raise ValueError(f"concurrencies {ladder}: need at least one, all >= 1")
    ranges: Schedule = []
    first = 1
    for c, upper in zip(ladder, [*ladder[1:], None], strict=True):
        last = c if upper is None else math.isqrt(c * upper)
        if ranges and ranges[-1][2] == best_k[c]:
            ranges[-1][1] = last
        else:
            ranges.append([first, last, best_k[c]])
        first = last + 1
    return ranges


def k_at(schedule: Sequence[Sequence[int]], batch_size: int) -> int:
    """The K vLLM uses at `batch_size` under `schedule` (a gap or the tail carries the K before it)."""
    k = 0
    for first, _last, range_k in validate_schedule(schedule):
        if first > batch_size:
            break
        k = range_k
    return k


def max_k(schedule: Sequence[Sequence[int]]) -> int:
    """The `num_speculative_tokens` to serve the schedule with (vLLM caps every K at it; at least 1)."""
    return max(1, *(k for _, _, k in validate_schedule(schedule)))

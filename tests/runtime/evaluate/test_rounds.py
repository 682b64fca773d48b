"""Rounds of a prompt set: ABBA order, and pooling a side's rounds (no server needed)."""

from __future__ import annotations

import pytest

from eagle3_runtime.evaluate.counters import SpecCounters
from eagle3_runtime.evaluate.rounds import BASELINE, CANDIDATE, DomainRun, Round, abba_order, pooled


def test_rounds_alternate_in_abba_order():
    assert abba_order(1) == [CANDIDATE, BASELINE]
    assert abba_order(3) == [CANDIDATE, BASELINE, BASELINE, CANDIDATE, CANDIDATE, BASELINE]


def test_pooled_rounds_add_tokens_seconds_and_counters_per_domain():
    def round_(tokens, seconds, drafts, accepted):
        run = DomainRun(4, tokens, seconds, SpecCounters(drafts, 3 * drafts, accepted, {0: accepted}))
        return Round(CANDIDATE, "2026-11-29T00:00:00+00:00", [0.0, 0.0, 0.0], {"code": run})

    total = pooled([round_(100, 2.0, 40, 60), round_(50, 0.5, 20, 10)])["code"]
    assert (total.prompts, total.tokens, total.seconds) == (4, 150, 2.5)
    assert total.counters.acceptance_length == pytest.approx(1 + 70 / 60)

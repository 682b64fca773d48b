"""Acceptance from vLLM's /metrics text (no server needed)."""

from __future__ import annotations

import pytest

from eagle3_runtime.evaluate.counters import parse_spec_counters

METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="t"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="t"} 50.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 300.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="t"} 150.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="t"} 180.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="t"} 90.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="1"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="2"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="t",position="0"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="t",position="1"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="t",position="2"} 20.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="t"} 999.0
"""


def test_counters_sum_engines_and_deltas_give_acceptance():
    before = parse_spec_counters(
        METRICS.replace("100.0", "40.0").replace("180.0", "60.0").replace(" 80.0", " 30.0")
    )
    after = parse_spec_counters(METRICS)
    assert (after.drafts, after.draft_tokens, after.accepted) == (150, 450, 270)
    assert after.acceptance_length == pytest.approx(1 + 270 / 150)
    assert after.acceptance_per_position(3) == pytest.approx([120 / 150, 90 / 150, 60 / 150])
    delta = after - before
    assert (delta.drafts, delta.accepted) == (60, 120)
    assert delta.accepted_per_position[0] == 50 and delta.accepted_per_position[1] == 0
    assert delta.acceptance_length == pytest.approx(3.0)


def test_no_drafts_means_no_acceptance():
    counters = parse_spec_counters(
        "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 5.0\n"
    )
    assert counters.acceptance_length is None and counters.acceptance_per_position(3) == []

"""Acceptance from vLLM's /metrics text, and checkpoint selection (no server needed)."""

from __future__ import annotations

import argparse
import json

import pytest

from eagle3_runtime.evaluate.counters import parse_spec_counters
from eagle3_runtime.layout import Workspace
from eagle3_runtime.stages import select

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


def test_select_takes_the_best_measured_checkpoint_earliest_on_a_tie(tmp_path):
    workspace = Workspace(tmp_path)
    workspace.evaluations_dir.mkdir(parents=True)
    for step, length in ((60, 2.1), (120, 2.7), (180, 2.7)):
        workspace.evaluation_file(step).write_text(json.dumps({"step": step, "acceptance_length": length}))
    (workspace.evaluations_dir / "baseline-x.json").write_text(json.dumps({"acceptance_length": None}))
    result = select.run(argparse.Namespace(workspace=tmp_path))
    assert result.metrics == {"step": 120, "acceptance_length": 2.7}
    selection = json.loads(workspace.selection_file.read_text())
    assert selection["candidates"] == {"60": 2.1, "120": 2.7, "180": 2.7}


def test_select_without_evaluations_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="run `eagle3 evaluate` first"):
        select.run(argparse.Namespace(workspace=tmp_path))

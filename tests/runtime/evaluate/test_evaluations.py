"""Checkpoint selection from the evaluations kept under evaluations/ (no server needed)."""

from __future__ import annotations

import argparse
import json

import pytest

from eagle3_api.workspace import Workspace
from eagle3_runtime.stages import select


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

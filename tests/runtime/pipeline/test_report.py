"""The pipeline report: its header says how long the draft trained, in steps or in epochs; its
tables say when the baseline was measured and the selected checkpoint's acceptance per context length."""

import json

from eagle3_api.draft_training import DraftTraining
from eagle3_api.workspace import Workspace
from eagle3_runtime.pipeline.report import METRICS_FILE, write_report


def _report(tmp_path, **training) -> str:
    workspace = Workspace(tmp_path)
    workspace.reports_dir.mkdir(parents=True)
    rows = [{"step": s, "loss": 3.0 / s, "simulated_acceptance_length": 1.0 + s / 100} for s in (10, 20, 37)]
    (workspace.reports_dir / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {
        "target": {"model": "tiny"},
        "data": {"sources": [{"claimName": "p", "path": "p"}]},
        "training": training,
    }
    body = {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "DraftTraining",
        "metadata": {"name": "t"},
        "spec": spec,
    }
    return write_report(workspace, DraftTraining.model_validate(body)).read_text()


def test_report_names_steps_or_epochs_with_the_steps_they_made(tmp_path):
    assert "; 37 training steps (3 TTT steps)" in _report(tmp_path / "a", steps=37)
    by_epochs = _report(tmp_path / "b", epochs=3)
    assert "; 3 epochs (37 training steps) (" in by_epochs
    assert "None" not in by_epochs.split("\n")[2]
    assert (tmp_path / "b" / "reports" / "training-curves.png").stat().st_size > 0


def _report_of_selected(tmp_path, **evaluation) -> str:
    """The report of one evaluated checkpoint (step 37), selected."""
    workspace = Workspace(tmp_path)
    workspace.evaluations_dir.mkdir(parents=True)
    evaluation = {
        "step": 37,
        "acceptance_length": 2.5,
        "acceptance_per_position": [0.7, 0.5, 0.3],
        "tokens_per_second": 90.0,
        "speedup": 1.2,
        "per_domain": {"code": {"acceptance_length": 2.5, "prompts": 8}},
    } | evaluation
    workspace.evaluation_file(37).write_text(json.dumps(evaluation))
    workspace.selection_file.write_text(json.dumps({"step": 37}))
    return _report(tmp_path, steps=37)


def test_report_says_when_a_shared_baseline_was_measured(tmp_path):
    report = _report_of_selected(
        tmp_path,
        baseline_tokens_per_second=75.0,
        baseline_mode="cached",
        baseline_measured_at="2026-11-29T13:00:00+00:00",
    )
    assert "75.0 tokens/s, cached, measured 2026-11-29T13:00:00+00:00." in report
    assert "compares runs made at different times" in report


def test_report_tables_the_selected_checkpoints_acceptance_per_context_length(tmp_path):
    report = _report_of_selected(
        tmp_path,
        acceptance_by_context_length=[
            {"context_length": 1024, "acceptance_length": 2.4, "drafts": 300.0, "prompts": 4},
            {
                "context_length": 8192,
                "prompts": 0,
                "unfilled": "the evaluation prompts make at most 5000 tokens",
            },
        ],
    )
    assert "| 1024 | 2.400 | 300 | 4 |" in report
    assert "| 8192 | not measured: the evaluation prompts make at most 5000 tokens | - | 0 |" in report

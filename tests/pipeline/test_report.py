"""The pipeline report's header says how long the draft trained, in steps or in epochs."""

import json

from eagle3_runtime.layout import Workspace
from eagle3_runtime.pipeline.config import PipelineConfig
from eagle3_runtime.pipeline.report import METRICS_FILE, write_report


def _report(tmp_path, **training) -> str:
    workspace = Workspace(tmp_path)
    workspace.reports_dir.mkdir(parents=True)
    rows = [{"step": s, "loss": 3.0 / s, "simulated_acceptance_length": 1.0 + s / 100} for s in (10, 20, 37)]
    (workspace.reports_dir / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = PipelineConfig(target="tiny", sources=[], eval_prompts=[], **training)
    return write_report(workspace, config).read_text()


def test_report_names_steps_or_epochs_with_the_steps_they_made(tmp_path):
    assert "; 37 training steps (3 TTT steps)" in _report(tmp_path / "a", steps=37)
    by_epochs = _report(tmp_path / "b", steps=None, epochs=3)
    assert "; 3 epochs (37 training steps) (" in by_epochs
    assert "None" not in by_epochs.split("\n")[2]
    assert (tmp_path / "b" / "reports" / "training-curves.png").stat().st_size > 0

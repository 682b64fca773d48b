"""The contract package at the bottom: who imports whom, the one stage list, one Progress model."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys

import pytest
import yaml
from eagle3_operator.reconcile.jobs import latest_progress
from pydantic import ValidationError

from eagle3_api import crdgen, stage_plan
from eagle3_api.draft_training import DraftTraining
from eagle3_api.progress import PROGRESS_ANNOTATION, Progress
from eagle3_api.stages import STAGE_CONDITIONS, STAGES, TRAINING_STAGES
from eagle3_runtime import cli
from eagle3_runtime.progress import ProgressReporter
from tests.support.cluster import REPO_ROOT

PACKAGES = {
    "eagle3_api": REPO_ROOT / "eagle3_api",
    "eagle3_operator": REPO_ROOT / "operator" / "eagle3_operator",
    "eagle3_runtime": REPO_ROOT / "eagle3_runtime",
}
# Which of the three packages each may import: the contract imports neither side, and the sides
# meet only in it.
MAY_IMPORT = {
    "eagle3_api": {"eagle3_api"},
    "eagle3_operator": {"eagle3_api", "eagle3_operator"},
    "eagle3_runtime": {"eagle3_api", "eagle3_runtime"},
}


def _imported_modules(tree: ast.AST):
    """(line, module) of every absolute import, function-local ones too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def test_imports_point_down_to_eagle3_api_only():
    wrong = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            for line, module in _imported_modules(ast.parse(path.read_text(), str(path))):
                top = module.split(".")[0]
                if top in PACKAGES and top not in MAY_IMPORT[package]:
                    wrong.append(f"{path.relative_to(REPO_ROOT)}:{line} imports {module}")
    assert not wrong, "imports against the direction (operator -> api <- runtime):\n" + "\n".join(wrong)


def test_the_import_check_sees_a_wrong_way_import():
    """The check above reads lazy imports inside functions too."""
    tree = ast.parse("def f():\n    from eagle3_runtime.files import write_json_atomic\n")
    assert list(_imported_modules(tree)) == [(2, "eagle3_runtime.files")]


def test_eagle3_api_imports_no_cluster_client_and_no_ml_stack():
    """Both images carry it; the operator's has no ML stack and the runtime's no kopf."""
    modules = sorted(f"eagle3_api.{path.stem}" for path in PACKAGES["eagle3_api"].glob("[!_]*.py"))
    heavy = ("kopf", "kubernetes", "torch", "vllm", "transformers", "eagle3_operator", "eagle3_runtime")
    code = f"import sys, {', '.join(modules)}; print([m for m in {heavy!r} if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_one_stage_list_names_the_cli_commands_conditions_and_crd_enum():
    names = [stage.name for stage in STAGES]
    assert list(cli.STAGES) == names
    for name in names:
        assert importlib.util.find_spec(f"eagle3_runtime.stages.{name}"), f"eagle3 {name} has no stage module"
    assert list(STAGE_CONDITIONS) == list(TRAINING_STAGES)
    assert set(TRAINING_STAGES) < set(names)
    crd = crdgen.build_crds()["eagle3.ai_drafttrainings.yaml"]
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["stages"]["items"]["properties"]["name"]["enum"] == list(TRAINING_STAGES)
    assert status["progress"]["properties"]["stage"]["enum"] == list(TRAINING_STAGES)


def test_a_spec_that_asks_for_every_stage_runs_them_in_the_list_order():
    body = yaml.safe_load((REPO_ROOT / "examples" / "drafttraining-tiny-cpu.yaml").read_text())
    body["spec"] |= {"hiddenStates": {"mode": "offline"}, "export": {"quantize": "fp8"}}
    body["spec"]["evaluation"] = {**body["spec"].get("evaluation", {}), "sweep": {}}
    assert stage_plan.stages(DraftTraining.model_validate(body)) == list(TRAINING_STAGES)


def test_progress_as_the_runtime_writes_it_refuses_a_field_it_does_not_know():
    with pytest.raises(ValidationError, match="tokensPerSec"):
        Progress.model_validate({"stage": "generate", "tokensPerSec": 10.0}, extra="forbid")
    with pytest.raises(ValidationError, match="stage"):
        Progress.model_validate({"stage": "pipeline"})  # not a DraftTraining stage


def test_what_the_runtime_reports_the_operator_reads_field_for_field(tmp_path, monkeypatch):
    monkeypatch.delenv("POD_NAME", raising=False)
    reporter = ProgressReporter("generate", tmp_path)
    # The fields `eagle3 generate` reports (generate.py), which the operator used to drop.
    reporter.report(samples=3, total_samples=8, tokens_per_second=41.5, eta_seconds=12)
    record = json.loads((tmp_path / "progress" / "generate.json").read_text())
    assert {k: v for k, v in record.items() if k != "updatedAt"} == {
        "stage": "generate",
        "samples": 3,
        "totalSamples": 8,
        "tokensPerSecond": 41.5,
        "etaSeconds": 12,
    }
    with pytest.raises(ValidationError, match="tokens_per_sec"):
        reporter.report(force=True, tokens_per_sec=1.0)

    def pod(record: str) -> dict:
        return {"metadata": {"annotations": {PROGRESS_ANNOTATION: record}}}

    older = json.dumps(record | {"samples": 1, "updatedAt": "2026-01-01T00:00:00Z"})
    newest = latest_progress([pod(older), pod(json.dumps(record)), pod("not json")])
    assert newest is not None and newest.to_json() == record
    # From a newer runtime image, as every API part reads: the operator keeps the fields it knows.
    newer = record | {"updatedAt": "2099-01-01T00:00:00Z"}
    read = latest_progress([pod(json.dumps(record)), pod(json.dumps(newer | {"learningRate": 1e-4}))])
    assert read is not None and read.to_json() == newer

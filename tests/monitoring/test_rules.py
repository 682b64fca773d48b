"""The chart's PrometheusRule, checked and unit-tested with the real promtool."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from tests.chart.helm import rendered_rule_groups
from tests.monitoring.promtool import promtool

HERE = Path(__file__).parent
UNIT_TESTS = HERE / "rules_test.yaml"


def write_rules(tmp_path: Path, *values: dict) -> Path:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rendered_rule_groups(tmp_path, *values), sort_keys=False))
    return rules


def rule_names(groups: dict, key: str) -> set[str]:
    return {rule[key] for group in groups["groups"] for rule in group["rules"] if key in rule}


def test_promtool_check_rules_accepts_the_rendered_rules(tmp_path):
    rules = write_rules(tmp_path)
    groups = yaml.safe_load(rules.read_text())
    count = len(rule_names(groups, "record")) + len(rule_names(groups, "alert"))
    result = promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_promtool_unit_tests_pass(tmp_path):
    write_rules(tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = promtool("test", "rules", UNIT_TESTS.name, cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_unit_tests_exercise_every_recording_rule_and_alert(tmp_path):
    groups = yaml.safe_load(write_rules(tmp_path).read_text())
    unit_tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    queried = " ".join(case["expr"] for test in unit_tests for case in test.get("promql_expr_test", []))
    fired = {
        case["alertname"]
        for test in unit_tests
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    quiet = {
        case["alertname"]
        for test in unit_tests
        for case in test.get("alert_rule_test", [])
        if not case["exp_alerts"]
    }
    records = rule_names(groups, "record")
    alerts = rule_names(groups, "alert")
    assert len(records) == 8 and len(alerts) == 6
    assert {name for name in records if name not in queried} == set()
    assert alerts - fired == set(), "alerts never seen firing"
    assert alerts - quiet == set(), "alerts never seen staying quiet"


def test_thresholds_and_window_follow_the_values(tmp_path):
    values = {
        "prometheusRule": {
            "rateWindow": "10m",
            "alerts": {
                "acceptanceLengthLow": {"threshold": 2.25, "for": "30m", "severity": "critical"},
                "trainingStalled": {"stalledAfterSeconds": 7200},
                "reconcileErrors": {"enabled": False},
            },
        }
    }
    rules = write_rules(tmp_path, values)
    groups = yaml.safe_load(rules.read_text())
    by_name = {
        rule.get("alert") or rule["record"]: rule for group in groups["groups"] for rule in group["rules"]
    }
    low = by_name["Eagle3AcceptanceLengthLow"]
    assert (
        low["expr"].strip() == "specdecodedeployment:vllm_spec_decode_mean_acceptance_length:rate10m < 2.25"
    )
    assert (low["for"], low["labels"]["severity"]) == ("30m", "critical")
    assert "[10m]" in by_name["specdecodedeployment:vllm_spec_decode_drafts:rate10m"]["expr"]
    assert "> 7200" in by_name["Eagle3DraftTrainingStalled"]["expr"]
    assert "Eagle3OperatorReconcileErrors" not in by_name
    result = promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr

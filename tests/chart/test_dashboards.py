"""The chart's dashboard JSON is what hack/dashboards.py builds with the Grafana Foundation SDK."""

import importlib.util
import subprocess
import sys

import pytest

from tests.support.cluster import REPO_ROOT


def test_dashboard_json_matches_its_generator():
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        pytest.fail(
            "grafana-foundation-sdk (requirements/lock.txt) is not installed in this Python: "
            "`make env` builds the environment from the lock file"
        )
    check = subprocess.run(
        [sys.executable, "hack/dashboards.py", "--check"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert check.returncode == 0, f"the dashboards drifted from hack/dashboards.py:\n{check.stderr}"

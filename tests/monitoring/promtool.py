"""The Debian prometheus/promtool binaries the monitoring tests run (hack/system-deps.sh installs them)."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run `bash hack/system-deps.sh` (apt package prometheus)")
    return path


def promtool(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=120)

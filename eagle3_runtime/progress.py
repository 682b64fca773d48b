"""Progress reports of a running stage: a local JSON file, and the pod annotation the operator reads.

The record is eagle3_api.progress.Progress, the model the operator parses it with. See
docs/contracts.md ("Progress while a stage runs").
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eagle3_api.progress import Progress, progress_patch
from eagle3_api.stages import TrainingStageName
from eagle3_runtime.files import write_json_atomic

_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
log = logging.getLogger(__name__)


class ProgressReporter:
    """Throttled progress sink; `report()` is cheap enough to call every step."""

    def __init__(
        self,
        stage: TrainingStageName,
        workspace: str | os.PathLike[str] | None,
        *,
        min_interval_s: float = 10.0,
    ):
        self.stage = stage
        self.path = Path(workspace) / "progress" / f"{stage}.json" if workspace else None
        self.min_interval_s = min_interval_s
        self._last_sent = 0.0
        self._pod = (os.environ.get("POD_NAMESPACE"), os.environ.get("POD_NAME"))

    def report(self, *, force: bool = False, **fields: Any) -> None:
        """`fields`: Progress's own (snake_case) besides stage and updated_at, which this sets. The
        record is built before the throttle, so a field Progress does not know fails at once."""
        updated_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        progress = Progress.model_validate(
            {"stage": self.stage, "updated_at": updated_at, **fields}, extra="forbid"
        )
        now = time.monotonic()
        if not force and now - self._last_sent < self.min_interval_s:
            return
        self._last_sent = now
        record = progress.to_json()
        if self.path:
            write_json_atomic(self.path, record)
        if all(self._pod) and _SA_DIR.exists():
            self._annotate_pod(record)

    def _annotate_pod(self, record: dict[str, Any]) -> None:
        # Progress is best effort: a failed patch must never fail the stage.
        try:
            from kubernetes import client, config

            config.load_incluster_config()
            namespace, name = self._pod
            client.CoreV1Api().patch_namespaced_pod(name, namespace, progress_patch(record))
        except Exception as exc:  # noqa: BLE001
            log.warning("could not annotate pod with progress: %s", exc)

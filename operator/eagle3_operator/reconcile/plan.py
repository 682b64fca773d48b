"""What one reconcile decides: objects to create or keep in sync, deletions, status, events."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class Event:
    type: str  # "Normal" | "Warning"
    reason: str
    message: str


@dataclass
class Plan:
    # Created when missing and never changed afterwards (Jobs and PVCs are immutable in what matters).
    create: list[dict[str, Any]] = field(default_factory=list)
    # Created when missing, patched when they drift from this (Deployments, Services, monitors).
    sync: list[dict[str, Any]] = field(default_factory=list)
    # {"apiVersion", "kind", "name"} of children to remove.
    delete: list[dict[str, str]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    # Reconcile again after this many seconds even without a watch event.
    requeue_after: float | None = None


def iso(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))

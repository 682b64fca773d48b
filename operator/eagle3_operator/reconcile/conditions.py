"""Status conditions that change lastTransitionTime only when their status flips."""

from __future__ import annotations

from typing import Any


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
) -> None:
    """Insert or update one condition in place (the list is written back whole)."""
    status_text = status if isinstance(status, str) else ("True" if status else "False")
    new = {
        "type": type_,
        "status": status_text,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now,
    }
    for i, old in enumerate(conditions):
        if old.get("type") == type_:
            if old.get("status") == status_text:
                new["lastTransitionTime"] = old.get("lastTransitionTime", now)
            conditions[i] = new
            return
    conditions.append(new)


def get_condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)

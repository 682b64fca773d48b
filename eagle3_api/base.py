"""Shared pieces of the API models: camelCase JSON, and helpers that keep CRD and model defaults equal."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of every API object part: snake_case in Python, camelCase on the wire."""

    # extra="ignore": the API server prunes unknown fields anyway, and an operator older than the
    # installed CRD must still read objects that carry newer fields.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_json(self) -> dict[str, Any]:
        """The wire form, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def section(model: type[BaseModel], description: str) -> Any:
    """A nested spec section that is optional and filled with its own defaults.

    `default: {}` in the CRD makes the API server apply the section's field defaults too, so
    what `kubectl get -o yaml` shows matches what the operator assumes.
    """
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


def cel(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    return entry


# Bounded strings keep the API server's CEL cost estimates finite.
DnsName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
ShortText = Annotated[str, Field(max_length=1024)]
Quantity = Annotated[str, Field(max_length=64, pattern=r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")]
StringMap = Annotated[dict[str, Annotated[str, Field(max_length=4096)]], Field(max_length=64)]
FREE_FORM_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

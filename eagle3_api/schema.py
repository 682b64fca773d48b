"""Turn pydantic JSON Schema into a Kubernetes structural OpenAPI v3 schema.

Structural means: no $ref, no anyOf, a type on every node (or an explicit
x-kubernetes-preserve-unknown-fields), so the API server can prune, default and run CEL.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

_DROPPED_KEYS = {"title"}


class SchemaError(ValueError):
    """The model uses a construct that has no structural equivalent."""


def structural_schema(model: type[BaseModel], *, keep_defaults: bool = True) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs, keep_defaults, path=model.__name__)


def _convert(
    node: dict[str, Any], defs: dict[str, Any], keep_defaults: bool, path: str, *, is_field: bool = True
) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        referenced = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        # Keys next to the $ref (the field's description, default) win over the model's own.
        node = {**referenced, **node}
    if node.get("x-kubernetes-int-or-string"):
        # An integer or a string (Kubernetes' int-or-string): no type; a CEL rule checks the values.
        node.pop("anyOf", None)
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise SchemaError(f"{path}: only Optional[X] unions are supported")
        if node.get("default", ...) is None:
            del node["default"]
        branch = branches[0]
        if "$ref" in branch:
            branch = {**defs[branch["$ref"].rsplit("/", 1)[-1]]}
        node = {**branch, **node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS or (key == "default" and not keep_defaults):
            continue
        if key == "additionalProperties" and value is True:
            continue  # free-form objects say so with x-kubernetes-preserve-unknown-fields
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema 2020 numbers -> OpenAPI v3.0 boolean flags.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {
                name: _convert(sub, defs, keep_defaults, f"{path}.{name}") for name, sub in value.items()
            }
        elif key == "items":
            out[key] = _convert(value, defs, keep_defaults, f"{path}[]", is_field=False)
        elif key == "additionalProperties" and isinstance(value, dict):
            out[key] = _convert(value, defs, keep_defaults, f"{path}{{}}", is_field=False)
        else:
            out[key] = value
    untyped = ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string")
    if "type" not in out and not any(out.get(marker) for marker in untyped):
        raise SchemaError(f"{path}: no type; give the field a concrete type or a free-form object marker")
    if is_field and "description" not in out:
        raise SchemaError(f"{path}: no description (kubectl explain needs one on every field)")
    return out

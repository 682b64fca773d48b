"""The API models and the CRDs generated from them (no cluster)."""

from __future__ import annotations

import pytest
import yaml
from eagle3_operator.api import DraftTraining, SpecDecodeDeployment, crdgen
from eagle3_operator.api.base import ApiModel
from eagle3_operator.api.schema import SchemaError, structural_schema
from pydantic import Field


def test_generated_crd_files_match_the_models():
    assert crdgen.main(["--check"]) == 0, "crds/ drifted from the API models: run `make crds`"


def _walk(schema: dict, path: str = ""):
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name", sorted(crdgen.build_crds()))
def test_crd_schemas_are_structural_and_explained(name):
    crd = crdgen.build_crds()[name]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        assert "title" not in node, path
    for root in ("spec", "status"):
        for path, node in _walk(schema["properties"][root], root):
            is_field = not path.endswith("[]") and not path.endswith("{}")
            assert not is_field or node.get("description"), f"{path} has no description"
    # Defaults are only for spec fields: status defaults would be re-applied on every read.
    assert not [p for p, n in _walk(schema["properties"]["status"]) if "default" in n]


def test_round_trip_through_yaml_keeps_everything():
    for crd in crdgen.build_crds().values():
        assert yaml.safe_load(crdgen.render(crd)) == crd


def test_sections_default_to_empty_objects_so_inner_defaults_apply():
    spec = crdgen.build_crds()["eagle3.ai_drafttrainings.yaml"]["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"
    ]["properties"]["spec"]
    assert spec["properties"]["training"]["default"] == {}
    assert spec["properties"]["training"]["properties"]["steps"]["default"] == 2000
    assert spec["required"] == ["target", "data"]


def test_scale_subresource_and_short_names():
    sdd = crdgen.build_crds()["eagle3.ai_specdecodedeployments.yaml"]["spec"]
    assert sdd["names"]["shortNames"] == ["sdd"]
    assert sdd["versions"][0]["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    dt = crdgen.build_crds()["eagle3.ai_drafttrainings.yaml"]["spec"]
    assert dt["names"]["shortNames"] == ["dt"] and "eagle3" in dt["names"]["categories"]


def test_models_parse_camel_case_and_fill_defaults():
    body = {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "DraftTraining",
        "metadata": {"name": "x"},
        "spec": {
            "target": {"model": "meta-llama/Llama-3.1-8B-Instruct", "tensorParallelSize": 1},
            "data": {"sources": [{"claimName": "prompts", "path": "chat.jsonl"}]},
            "hiddenStates": {"mode": "online", "layerIds": [2, 16, 29]},
        },
    }
    obj = DraftTraining.model_validate(body)
    assert obj.spec.hidden_states.layer_ids == [2, 16, 29]
    assert obj.spec.training.ttt_steps == 3
    assert obj.spec.storage.retain_on_delete is True
    sdd = SpecDecodeDeployment.model_validate(
        {
            "apiVersion": "eagle3.ai/v1alpha1",
            "kind": "SpecDecodeDeployment",
            "spec": {"target": {"model": "pvc://models/llama"}, "draft": {"fromDraftTraining": "x"}},
        }
    )
    assert sdd.spec.draft.from_draft_training == "x" and sdd.spec.replicas == 1


def test_schema_generator_refuses_unexplained_or_untyped_fields():
    class Undocumented(ApiModel):
        count: int = 1

    class Untyped(ApiModel):
        anything: object = Field(None, description="no type")

    with pytest.raises(SchemaError, match="description"):
        structural_schema(Undocumented)
    with pytest.raises(SchemaError, match="no type"):
        structural_schema(Untyped)

"""The contract between the eagle3 operator and the runtime it runs in pods.

Both `eagle3_operator` and `eagle3_runtime` import this package, and it imports neither (a unit
test checks the arrows): the API models that generate the CRDs (`draft_training`,
`spec_decode_deployment`, `crdgen`), the stage list (`stages`), the workspace layout
(`workspace`), what a stage reports (`stage_result`, `progress`), the DraftTraining -> stage
commands builder (`stage_plan`) and the speculation schedule's rules (`sweep_schedule`).
Pure: pydantic and PyYAML only, no kopf, kubernetes, torch or vLLM.
"""

GROUP = "eagle3.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

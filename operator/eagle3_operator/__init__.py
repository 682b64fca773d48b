"""The eagle3 Kubernetes operator: DraftTraining and SpecDecodeDeployment resources."""

GROUP = "eagle3.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

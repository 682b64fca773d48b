"""The eagle3 Kubernetes operator: DraftTraining and SpecDecodeDeployment resources (API: eagle3_api)."""

{{/*
The operator's rights in a namespace it serves: a ClusterRole cluster-wide, a Role per namespace
with watchNamespaces. Kept in step with what eagle3_operator reads and writes (kube.py, handlers.py):
tests/chart/test_install.py runs the real operator with exactly these rights.
*/}}
{{- define "eagle3-operator.operatorRules" -}}
- apiGroups: [eagle3.ai]
  resources: [drafttrainings, specdecodedeployments]
  verbs: [get, list, watch, patch]
# The scale subresource is for HPA/KEDA and kubectl scale: the operator only reads spec.replicas.
- apiGroups: [eagle3.ai]
  resources: [drafttrainings/status, specdecodedeployments/status]
  verbs: [get, patch]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services, persistentvolumeclaims]
  verbs: [get, list, watch, create, patch, delete]
# Stage pods are read for their results (termination messages) and progress annotations.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors, podmonitors]
  verbs: [get, list, watch, create, patch, delete]
{{- end }}

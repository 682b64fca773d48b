{{/*
The operator's rights in a namespace it serves: a ClusterRole cluster-wide, a Role per namespace
with watchNamespaces. Kept in step with docs/architecture.md; the install test in
tests/chart/test_install.py runs the real operator with exactly these rights.
*/}}
{{- define "eagle3-operator.operatorRules" -}}
- apiGroups: [eagle3.ai]
  resources: [drafttrainings, specdecodedeployments]
  verbs: [get, list, watch, patch, update]
- apiGroups: [eagle3.ai]
  resources: [drafttrainings/status, specdecodedeployments/status, specdecodedeployments/scale]
  verbs: [get, patch, update]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [services, persistentvolumeclaims, configmaps]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors, podmonitors]
  verbs: [get, list, watch, create, patch, update, delete]
{{- end }}

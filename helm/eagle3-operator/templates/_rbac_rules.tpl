{{/*
The operator's rights in a namespace it serves: a ClusterRole cluster-wide, a Role per namespace
with watchNamespaces. The same list as docs/architecture.md ("RBAC the operator needs");
tests/chart/test_install.py runs the real operator with exactly these rights.
*/}}
{{- define "eagle3-operator.operatorRules" -}}
- apiGroups: [eagle3.ai]
  resources: [drafttrainings, specdecodedeployments]
  verbs: [get, list, watch]
# The scale subresource is for HPA/KEDA and kubectl scale: the operator only reads spec.replicas.
- apiGroups: [eagle3.ai]
  resources: [drafttrainings/status, specdecodedeployments/status]
  verbs: [patch]
# Children carry ownerReferences with blockOwnerDeletion: true; where the
# OwnerReferencesPermissionEnforcement admission plugin runs (OpenShift), setting it needs `update`
# on the owner's finalizers.
- apiGroups: [eagle3.ai]
  resources: [drafttrainings/finalizers, specdecodedeployments/finalizers]
  verbs: [update]
# Stage Jobs; delete: a retry after a spec edit replaces the failed stage's Jobs.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
# Target and serving Deployments and Services (server-side apply creates and patches); watched,
# like the workspace PVCs, to keep the reconciles' cache. A promoted canary's Deployment is deleted.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# A Service is deleted only to be made again where a field it must change is immutable (the
# target's, made with a ClusterIP before the servers went headless).
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, create]
# Stage results (termination messages) and progress annotations.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# create: transition Events; list: why a Job creates no pods (its FailedCreate Events).
- apiGroups: [""]
  resources: [events]
  verbs: [create, list]
# The serving pods' PodDisruptionBudget (listed per reconcile, like the monitors).
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, create, patch]
# spec.networkPolicy: kept in sync while enabled (watched), deleted once turned off.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors, podmonitors]
  verbs: [get, list, create, patch]
{{- end }}

{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "eagle3-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: the release name, with the chart name unless it already has it. */}}
{{- define "eagle3-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "eagle3-operator.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "eagle3-operator.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "eagle3-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eagle3-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "eagle3-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "eagle3-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: eagle3-operator
{{- end }}

{{- define "eagle3-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "eagle3-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The ClusterRole bound to the runtime ServiceAccount of the pods the operator creates. */}}
{{- define "eagle3-operator.runtimeRoleName" -}}
{{- printf "%s-runtime" (include "eagle3-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* image reference: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "eagle3-operator.imageRef" -}}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) }}
{{- end }}

{{/* Suffix of the recorded series names, e.g. rate5m. */}}
{{- define "eagle3-operator.rateSuffix" -}}
{{- printf "rate%s" .Values.prometheusRule.rateWindow }}
{{- end }}

{{/* matchResources of a policy binding: the watched namespaces, or (none) every namespace. */}}
{{- define "eagle3-operator.policyNamespaces" -}}
{{- if .Values.watchNamespaces }}
matchResources:
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values: {{ toJson .Values.watchNamespaces }}
{{- end }}
{{- end }}

{{/*
Prometheus rule groups: recording rules per SpecDecodeDeployment, and alerts. Rendered into the
PrometheusRule's spec; tests/monitoring runs promtool on exactly this rendering.
Serving series carry `namespace` and `specdecodedeployment` (the PodMonitor / the operator's
ServiceMonitor relabels them from the pod's namespace and eagle3.ai/spec-decode-deployment label).
*/}}
{{- define "eagle3-operator.ruleGroups" -}}
{{- $w := .Values.prometheusRule.rateWindow }}
{{- $s := include "eagle3-operator.rateSuffix" . }}
{{- $by := "namespace, specdecodedeployment" }}
{{- $alerts := .Values.prometheusRule.alerts }}
groups:
  - name: eagle3-spec-decode.rules
    rules:
      - record: specdecodedeployment:vllm_spec_decode_drafts:{{ $s }}
        expr: sum by ({{ $by }}) (rate(vllm:spec_decode_num_drafts_total[{{ $w }}]))
      - record: specdecodedeployment:vllm_spec_decode_draft_tokens:{{ $s }}
        expr: sum by ({{ $by }}) (rate(vllm:spec_decode_num_draft_tokens_total[{{ $w }}]))
      - record: specdecodedeployment:vllm_spec_decode_accepted_tokens:{{ $s }}
        expr: sum by ({{ $by }}) (rate(vllm:spec_decode_num_accepted_tokens_total[{{ $w }}]))
      - record: specdecodedeployment:vllm_spec_decode_accepted_tokens_per_position:{{ $s }}
        expr: sum by ({{ $by }}, position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total[{{ $w }}]))
      - record: specdecodedeployment:vllm_generation_tokens:{{ $s }}
        expr: sum by ({{ $by }}) (rate(vllm:generation_tokens_total[{{ $w }}]))
      # Tokens each target forward pass yields: the bonus token plus the accepted draft tokens.
      - record: specdecodedeployment:vllm_spec_decode_mean_acceptance_length:{{ $s }}
        expr: |
          1 + specdecodedeployment:vllm_spec_decode_accepted_tokens:{{ $s }}
            / specdecodedeployment:vllm_spec_decode_drafts:{{ $s }}
      - record: specdecodedeployment:vllm_spec_decode_acceptance_rate:{{ $s }}
        expr: |
          specdecodedeployment:vllm_spec_decode_accepted_tokens:{{ $s }}
            / specdecodedeployment:vllm_spec_decode_draft_tokens:{{ $s }}
      # Share of drafts whose token at this position was accepted.
      - record: specdecodedeployment:vllm_spec_decode_position_acceptance_rate:{{ $s }}
        expr: |
          specdecodedeployment:vllm_spec_decode_accepted_tokens_per_position:{{ $s }}
            / on ({{ $by }}) group_left
          specdecodedeployment:vllm_spec_decode_drafts:{{ $s }}
  - name: eagle3.alerts
    rules:
      {{- with $alerts.acceptanceLengthLow }}
      {{- if .enabled }}
      - alert: Eagle3AcceptanceLengthLow
        expr: specdecodedeployment:vllm_spec_decode_mean_acceptance_length:{{ $s }} < {{ .threshold }}
        for: {{ .for | default "15m" }}
        labels:
          severity: {{ .severity | default "warning" }}
        annotations:
          summary: {{ printf "Speculative decoding of %s/%s accepts few draft tokens" "{{ $labels.namespace }}" "{{ $labels.specdecodedeployment }}" | quote }}
          description: {{ printf "Mean acceptance length is %s (threshold %v) over %s. The draft no longer matches the traffic: retrain it on recent prompts (DraftTraining) or check that it belongs to this target." "{{ $value | printf \"%.2f\" }}" .threshold $w | quote }}
      {{- end }}
      {{- end }}
      {{- with $alerts.draftProposesNothing }}
      {{- if .enabled }}
      - alert: Eagle3DraftProposesNothing
        expr: |
          (specdecodedeployment:vllm_generation_tokens:{{ $s }} > 0)
          unless on ({{ $by }})
          (specdecodedeployment:vllm_spec_decode_draft_tokens:{{ $s }} > 0)
        for: {{ .for | default "10m" }}
        labels:
          severity: {{ .severity | default "warning" }}
        annotations:
          summary: {{ printf "The draft of %s/%s proposes no tokens" "{{ $labels.namespace }}" "{{ $labels.specdecodedeployment }}" | quote }}
          description: {{ printf "vLLM generates %s tokens/s but proposes no draft tokens: speculative decoding is off or the draft failed to load. Check the server's --speculative-config and logs." "{{ $value | printf \"%.1f\" }}" | quote }}
      {{- end }}
      {{- end }}
      {{- with $alerts.draftDegraded }}
      {{- if .enabled }}
      # The operator's DraftDegraded condition (live acceptance over spec.liveAcceptance's window below
      # degradedRatio x the draft's evaluated acceptance); the value is the live acceptance length.
      - alert: Eagle3DraftDegraded
        expr: |
          max by ({{ $by }}) (eagle3_specdecode_live_acceptance_length)
          and on ({{ $by }})
          (max by ({{ $by }}) (eagle3_specdecode_draft_degraded) == 1)
        for: {{ .for | default "5m" }}
        labels:
          severity: {{ .severity | default "warning" }}
        annotations:
          summary: {{ printf "The draft of %s/%s accepts fewer tokens live than when it was evaluated" "{{ $labels.namespace }}" "{{ $labels.specdecodedeployment }}" | quote }}
          description: {{ printf "Live mean acceptance length %s is below spec.liveAcceptance.degradedRatio times the evaluated one (condition DraftDegraded; `kubectl describe specdecodedeployment %s` shows both). The traffic moved away from the training data: retrain the draft on recent prompts." "{{ $value | printf \"%.2f\" }}" "{{ $labels.specdecodedeployment }}" | quote }}
      {{- end }}
      {{- end }}
      {{- with $alerts.servingUnavailable }}
      {{- if .enabled }}
      - alert: Eagle3SpecDecodeServingUnavailable
        expr: |
          (max by (namespace, deployment) (kube_deployment_spec_replicas) > 0)
          * on (namespace, deployment) group_left (specdecodedeployment)
          label_replace(
            max by (namespace, deployment, label_eagle3_ai_spec_decode_deployment) (
              kube_deployment_labels{label_eagle3_ai_spec_decode_deployment!=""}
            ),
            "specdecodedeployment", "$1", "label_eagle3_ai_spec_decode_deployment", "(.*)"
          )
          and on (namespace, deployment)
          (max by (namespace, deployment) (kube_deployment_status_replicas_ready) == 0)
        for: {{ .for | default "10m" }}
        labels:
          severity: {{ .severity | default "critical" }}
        annotations:
          summary: {{ printf "SpecDecodeDeployment %s/%s has no ready vLLM replica" "{{ $labels.namespace }}" "{{ $labels.specdecodedeployment }}" | quote }}
          description: {{ printf "Deployment %s wants %s replicas and none is ready. See `kubectl describe specdecodedeployment` and the vLLM pods' events and logs." "{{ $labels.deployment }}" "{{ $value }}" | quote }}
      {{- end }}
      {{- end }}
      {{- with $alerts.trainingStalled }}
      {{- if .enabled }}
      - alert: Eagle3DraftTrainingStalled
        expr: |
          (time() - eagle3_draft_training_last_progress_timestamp_seconds > {{ .stalledAfterSeconds }})
          and on (namespace, name) (eagle3_draft_training_phase{phase="Running"} == 1)
          unless on (namespace, name)
          (eagle3_draft_training_step >= eagle3_draft_training_total_steps)
        for: {{ .for | default "5m" }}
        labels:
          severity: {{ .severity | default "warning" }}
        annotations:
          summary: {{ printf "DraftTraining %s/%s makes no progress" "{{ $labels.namespace }}" "{{ $labels.name }}" | quote }}
          description: {{ printf "No progress report for %s s (limit %v s). See `kubectl describe drafttraining` and the running stage pod's logs." "{{ $value | printf \"%.0f\" }}" .stalledAfterSeconds | quote }}
      {{- end }}
      {{- end }}
      {{- with $alerts.reconcileErrors }}
      {{- if .enabled }}
      - alert: Eagle3OperatorReconcileErrors
        expr: sum by (kind) (rate(eagle3_operator_reconcile_errors_total[{{ $w }}])) > 0
        for: {{ .for | default "15m" }}
        labels:
          severity: {{ .severity | default "warning" }}
        annotations:
          summary: {{ printf "The eagle3 operator keeps failing to reconcile %s objects" "{{ $labels.kind }}" | quote }}
          description: {{ printf "%s reconcile errors/s. See the operator's logs and the objects' Events." "{{ $value | printf \"%.3f\" }}" | quote }}
      {{- end }}
      {{- end }}
{{- end }}

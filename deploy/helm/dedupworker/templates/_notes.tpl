{{/* The text of NOTES.txt; a define so tests can render it (helm template does not). */}}
{{- define "dedupworker.notes" -}}
dedupworker {{ .Chart.AppVersion }} is running as {{ include "dedupworker.fullname" . }} in namespace {{ .Release.Namespace }}
with {{ len (.Values.config.handlers | default list) }} handler(s){{ range (.Values.config.handlers | default list) }} {{ .name }}{{ end }}.

Check the config as the pods see it:
  kubectl -n {{ .Release.Namespace }} get configmap {{ include "dedupworker.fullname" . }} -o jsonpath='{.data.config\.yaml}'

Readiness (store and brokers reachable) and metrics:
  kubectl -n {{ .Release.Namespace }} port-forward svc/{{ include "dedupworker.fullname" . }} {{ .Values.service.port }}
  curl -s localhost:{{ .Values.service.port }}/readyz
  curl -s localhost:{{ .Values.service.port }}/metrics | grep '^dedup_'
{{- if .Values.serviceMonitor.enabled }}

A ServiceMonitor scrapes the pods every {{ .Values.serviceMonitor.interval }}; import
deploy/grafana/dedupworker.json into Grafana for the dashboard.
{{- end }}
{{- if .Values.keda.enabled }}

KEDA scales the Deployment between {{ .Values.keda.minReplicaCount }} and {{ .Values.keda.maxReplicaCount }} replicas on consumer lag
(target {{ .Values.keda.lagThreshold }} pending messages per replica).
{{- else if .Values.autoscaling.enabled }}

A HorizontalPodAutoscaler scales the Deployment between {{ .Values.autoscaling.minReplicas }} and {{ .Values.autoscaling.maxReplicas }} replicas.
{{- end }}

Pods get {{ include "dedupworker.gracePeriod" . }}s after SIGTERM; config.shutdown_timeout is {{ include "dedupworker.shutdownSeconds" . }}s.
Inspect or forget a key from inside a pod:
  kubectl -n {{ .Release.Namespace }} exec deploy/{{ include "dedupworker.fullname" . }} -- dedupworker inspect -c /etc/dedupworker/config.yaml --handler NAME KEY
List a handler's records by state, delete them in bulk, and size the store:
  kubectl -n {{ .Release.Namespace }} exec deploy/{{ include "dedupworker.fullname" . }} -- dedupworker records -c /etc/dedupworker/config.yaml --handler NAME --state claimed --older-than 10m
  kubectl -n {{ .Release.Namespace }} exec deploy/{{ include "dedupworker.fullname" . }} -- dedupworker forget -c /etc/dedupworker/config.yaml --handler NAME --state dead_lettered --dry-run
  kubectl -n {{ .Release.Namespace }} exec deploy/{{ include "dedupworker.fullname" . }} -- dedupworker stats -c /etc/dedupworker/config.yaml --rate 100/s
Send a handler's dead letters back to its source once the cause is fixed (see first what would go):
  kubectl -n {{ .Release.Namespace }} exec deploy/{{ include "dedupworker.fullname" . }} -- dedupworker redrive -c /etc/dedupworker/config.yaml --handler NAME --dry-run
  kubectl -n {{ .Release.Namespace }} exec deploy/{{ include "dedupworker.fullname" . }} -- dedupworker redrive -c /etc/dedupworker/config.yaml --handler NAME
{{- end -}}

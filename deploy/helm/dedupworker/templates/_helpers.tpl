{{/* Names and labels. */}}
{{- define "dedupworker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dedupworker.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dedupworker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dedupworker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dedupworker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dedupworker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "dedupworker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dedupworker.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dedupworker.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}

{{/* Where things are mounted in the pod. */}}
{{- define "dedupworker.configDir" -}}/etc/dedupworker{{- end -}}
{{- define "dedupworker.secretDir" -}}/etc/dedupworker/secrets{{- end -}}

{{/*
dedupworker.seconds: a duration in Go's syntax plus "d" ("30s", "1m30s",
"500ms", "2d") as whole seconds, rounded up; 0 when it cannot be read
(e.g. a ${VAR} reference).
*/}}
{{- define "dedupworker.seconds" -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h|d)" (toString .) -1 -}}
{{- $n := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 -}}
{{- $u := regexFind "[a-zµ]+$" . -}}
{{- $total = addf $total (mulf $n (get $units $u)) -}}
{{- end -}}
{{- ceil $total | int -}}
{{- end -}}

{{/* The shutdown timeout of the config in seconds (default 30). */}}
{{- define "dedupworker.shutdownSeconds" -}}
{{- $s := include "dedupworker.seconds" (.Values.config.shutdown_timeout | default "30s") | atoi -}}
{{- if eq $s 0 }}30{{ else }}{{ $s }}{{ end -}}
{{- end -}}

{{- define "dedupworker.gracePeriod" -}}
{{- $shutdown := include "dedupworker.shutdownSeconds" . | atoi -}}
{{- $grace := .Values.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $grace -}}
{{- add $shutdown 15 -}}
{{- else if le (int $grace) $shutdown -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be above config.shutdown_timeout (%ds): Kubernetes would kill handlers the worker is still draining" $grace $shutdown) -}}
{{- else -}}
{{- int $grace -}}
{{- end -}}
{{- end -}}

{{/* The container port: the port of config.http.addr, which must listen on the pod's address. */}}
{{- define "dedupworker.port" -}}
{{- $addr := "" -}}
{{- with .Values.config.http }}{{ $addr = toString (.addr | default "") }}{{ end -}}
{{- if not $addr -}}
{{- fail "config.http.addr must be set (e.g. 0.0.0.0:9464): the probes, the Service and Prometheus need the metrics server, and its default 127.0.0.1:9464 is unreachable from outside the pod" -}}
{{- end -}}
{{- if or (hasPrefix "127." $addr) (hasPrefix "localhost:" $addr) (hasPrefix "[::1]:" $addr) -}}
{{- fail (printf "config.http.addr %q listens on loopback only: use 0.0.0.0:PORT so the kubelet and Prometheus reach it" $addr) -}}
{{- end -}}
{{- $port := regexFind ":[0-9]+$" $addr | trimPrefix ":" -}}
{{- if not $port -}}
{{- fail (printf "config.http.addr %q: want HOST:PORT, e.g. 0.0.0.0:9464" $addr) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{/*
Credentials. dedupworker.secretRef takes (dict "root" $ "which" "redis"|"kafkaSasl"|"nats")
and returns {"name","key"} as JSON for the Secret holding it, or "{}" when none is configured.
*/}}
{{- define "dedupworker.credentialsSecretName" -}}
{{- printf "%s-credentials" (include "dedupworker.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dedupworker.natsType" -}}
{{- $t := .Values.secrets.nats.type | default "creds" -}}
{{- if not (has $t (list "creds" "password" "token")) -}}
{{- fail (printf "secrets.nats.type %q: want creds, password or token" $t) -}}
{{- end -}}
{{- $t -}}
{{- end -}}

{{- define "dedupworker.chartSecretKey" -}}
{{- if eq .which "redis" }}redis-password
{{- else if eq .which "kafkaSasl" }}kafka-sasl-password
{{- else }}nats-{{ include "dedupworker.natsType" .root }}
{{- end -}}
{{- end -}}

{{- define "dedupworker.secretRef" -}}
{{- $s := index .root.Values.secrets .which -}}
{{- $value := ternary $s.value $s.password (eq .which "nats") -}}
{{- if $s.existingSecret -}}
{{- $key := $s.key -}}
{{- if and (eq .which "nats") (not $key) -}}
{{- $key = get (dict "creds" "nats.creds" "password" "password" "token" "token") (include "dedupworker.natsType" .root) -}}
{{- end -}}
{{- dict "name" $s.existingSecret "key" $key | toJson -}}
{{- else if $value -}}
{{- dict "name" (include "dedupworker.credentialsSecretName" .root) "key" (include "dedupworker.chartSecretKey" .) | toJson -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/* A value that may go into the ConfigMap in a secret's place: empty or a ${VAR} reference. */}}
{{- define "dedupworker.noLiteralSecret" -}}
{{- $v := toString (.value | default "") -}}
{{- if and $v (not (regexMatch "^\\$\\{[A-Za-z_][A-Za-z0-9_]*\\}$" $v)) -}}
{{- fail (printf "%s holds a literal secret, which would land in the ConfigMap: use secrets.* (the chart sets password_file / creds_file) or ${VAR} with the variable from env" .path) -}}
{{- end -}}
{{- end -}}

{{/* Fill a Kafka sasl block's password_file from secrets.kafkaSasl when it names no password. */}}
{{- define "dedupworker.fillSasl" -}}
{{- with .sasl -}}
{{- include "dedupworker.noLiteralSecret" (dict "path" (printf "%s.password" $.path) "value" .password) -}}
{{- if and $.ref.name (not .password) (not .password_file) -}}
{{- $_ := set . "password_file" (printf "%s/kafka-sasl/password" (include "dedupworker.secretDir" $.root)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dedupworker.checkNatsAuth" -}}
{{- with .nats -}}
{{- include "dedupworker.noLiteralSecret" (dict "path" (printf "%s.password" $.path) "value" .password) -}}
{{- include "dedupworker.noLiteralSecret" (dict "path" (printf "%s.token" $.path) "value" .token) -}}
{{- end -}}
{{- end -}}

{{/*
dedupworker.config: .Values.config as YAML, with references to the mounted
credentials filled in where the config names none, and a failure for any
literal secret (which would otherwise be stored in the ConfigMap).
*/}}
{{- define "dedupworker.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- $redisRef := include "dedupworker.secretRef" (dict "root" . "which" "redis") | fromJson -}}
{{- $saslRef := include "dedupworker.secretRef" (dict "root" . "which" "kafkaSasl") | fromJson -}}
{{- $natsRef := include "dedupworker.secretRef" (dict "root" . "which" "nats") | fromJson -}}
{{- $natsType := include "dedupworker.natsType" . -}}
{{- $secretDir := include "dedupworker.secretDir" . -}}
{{- $redis := $cfg.redis | default dict -}}
{{- $_ := set $cfg "redis" $redis -}}
{{- if and (not $redis.url) (not $redis.addrs) (not $redis.sentinel) -}}
{{- fail "config.redis.url, config.redis.addrs or config.redis.sentinel is required: where the deduplication store is (the binary's default, 127.0.0.1:6379, is not in the pod)" -}}
{{- end -}}
{{- with $redis.sentinel -}}
{{- include "dedupworker.noLiteralSecret" (dict "path" "config.redis.sentinel.password" "value" .password) -}}
{{- end -}}
{{- if not $redis.url -}}
{{- $_ := unset $redis "url" -}}
{{- end -}}
{{- include "dedupworker.noLiteralSecret" (dict "path" "config.redis.password" "value" $redis.password) -}}
{{- if and (regexMatch "^rediss?://[^/@]*:[^/@]+@" (toString ($redis.url | default ""))) (not (contains "${" (toString $redis.url))) -}}
{{- fail "config.redis.url holds a password, which would land in the ConfigMap: use secrets.redis (the chart sets redis.password_file) instead" -}}
{{- end -}}
{{- if and $redisRef.name (not $redis.password) (not $redis.password_file) -}}
{{- $_ := set $redis "password_file" (printf "%s/redis/password" $secretDir) -}}
{{- end -}}
{{- range $i, $h := ($cfg.handlers | default list) -}}
{{- $p := printf "config.handlers[%d]" $i -}}
{{- $src := $h.source | default dict -}}
{{- $action := $h.action | default dict -}}
{{- $fwd := $action.forward | default dict -}}
{{- $dl := $h.dead_letter | default dict -}}
{{- with $src.kafka -}}
{{- include "dedupworker.fillSasl" (dict "root" $ "ref" $saslRef "sasl" .sasl "path" (printf "%s.source.kafka.sasl" $p)) -}}
{{- end -}}
{{- with $fwd.kafka -}}
{{- include "dedupworker.fillSasl" (dict "root" $ "ref" $saslRef "sasl" .sasl "path" (printf "%s.action.forward.kafka.sasl" $p)) -}}
{{- end -}}
{{- with $dl.kafka -}}
{{- include "dedupworker.fillSasl" (dict "root" $ "ref" $saslRef "sasl" .sasl "path" (printf "%s.dead_letter.kafka.sasl" $p)) -}}
{{- end -}}
{{- include "dedupworker.checkNatsAuth" (dict "nats" $src.nats "path" (printf "%s.source.nats" $p)) -}}
{{- include "dedupworker.checkNatsAuth" (dict "nats" $fwd.nats "path" (printf "%s.action.forward.nats" $p)) -}}
{{- include "dedupworker.checkNatsAuth" (dict "nats" $dl.nats "path" (printf "%s.dead_letter.nats" $p)) -}}
{{- with $src.nats -}}
{{- if not (hasKey . "max_ack_pending") -}}
{{- /* Every pod binds to one durable: its MaxAckPending is the pods at most
       (keda.maxReplicaCount, autoscaling.maxReplicas or replicaCount) times
       each pod's window. A pod's window is its concurrency (the
       binary's default 16); a forward action is a batch handler, whose
       concurrency counts runs of up to max(concurrency, 128) messages each,
       so its window is concurrency × max(concurrency, 128), at most 4096
       (the worker's own default, transports/natssource Config.MaxAckPending
       and Config.Batch). */ -}}
{{- $pods := $.Values.replicaCount -}}
{{- if $.Values.keda.enabled -}}
{{- $pods = $.Values.keda.maxReplicaCount -}}
{{- else if $.Values.autoscaling.enabled -}}
{{- $pods = $.Values.autoscaling.maxReplicas -}}
{{- end -}}
{{- $conc := int ($h.concurrency | default 16) -}}
{{- $window := $conc -}}
{{- if $action.forward -}}
{{- $window = min (mul $conc (max $conc 128)) 4096 -}}
{{- end -}}
{{- $_ := set . "max_ack_pending" (mul (int $pods) $window) -}}
{{- end -}}
{{- if and $natsRef.name (not .creds_file) (not .password) (not .token) -}}
{{- if eq $natsType "creds" -}}
{{- $_ := set . "creds_file" (printf "%s/nats/nats.creds" $secretDir) -}}
{{- else if eq $natsType "password" -}}
{{- $_ := set . "password" "${DEDUP_NATS_PASSWORD}" -}}
{{- else -}}
{{- $_ := set . "token" "${DEDUP_NATS_TOKEN}" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

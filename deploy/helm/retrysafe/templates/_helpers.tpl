{{/* The chart's name, or nameOverride. */}}
{{- define "retrysafe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's resource name: fullnameOverride, or RELEASE-retrysafe (RELEASE when it holds the chart's name). */}}
{{- define "retrysafe.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "retrysafe.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "retrysafe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "retrysafe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "retrysafe.labels" -}}
helm.sh/chart: {{ include "retrysafe.chart" . }}
{{ include "retrysafe.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "retrysafe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "retrysafe.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret the chart creates for the DSN and the generated or given token. */}}
{{- define "retrysafe.secretName" -}}
{{- include "retrysafe.fullname" . }}
{{- end }}

{{/* The store's kind: store.kind, else read from the DSN's scheme. */}}
{{- define "retrysafe.storeKind" -}}
{{- $kind := .Values.store.kind }}
{{- if and (not $kind) (not .Values.store.existingSecret) }}
{{- $scheme := regexFind "^[A-Za-z0-9+]+" (.Values.store.dsn | trim) | lower }}
{{- $kind = get (dict "sqlite" "sqlite" "sqlite3" "sqlite" "postgres" "postgres" "postgresql" "postgres" "redis" "redis" "rediss" "redis" "memory" "memory" "mem" "memory") $scheme }}
{{- end }}
{{- $kind }}
{{- end }}

{{/*
The values' rules, checked before anything renders: a store, and one of SQLite's or
memory:'s only with one replica (SQLite is one process's file, memory: one process's
heap: two replicas would each hold their own records and run a retry again).
*/}}
{{- define "retrysafe.validate" -}}
{{- if and (not .Values.store.existingSecret) (not .Values.store.dsn) }}
{{- fail "retrysafe: set store.dsn, or store.existingSecret and store.kind" }}
{{- end }}
{{- $kind := include "retrysafe.storeKind" . }}
{{- if not (has $kind (list "postgres" "redis" "sqlite" "memory")) }}
{{- if .Values.store.existingSecret }}
{{- fail "retrysafe: store.kind must be postgres, redis, sqlite or memory with store.existingSecret (the chart cannot read the Secret's DSN)" }}
{{- else }}
{{- fail "retrysafe: store.dsn must be postgres://…, redis://…, sqlite:PATH or memory:" }}
{{- end }}
{{- end }}
{{- if and (has $kind (list "sqlite" "memory")) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "retrysafe: a %s store holds one process's records: replicaCount %d would let a retry run again on another replica; use replicaCount 1, or a PostgreSQL or Redis store" $kind (int .Values.replicaCount)) }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "retrysafe: tls.enabled needs tls.secretName, a Secret of type kubernetes.io/tls" }}
{{- end }}
{{- if and (not .Values.upstream) (not .Values.routes) }}
{{- fail "retrysafe: set upstream, or routes whose file names the upstreams" }}
{{- end }}
{{- end }}

{{/* The shutdown timeout in seconds: the value, or the gateway's default (upstream timeout + 5s). */}}
{{- define "retrysafe.shutdownSeconds" -}}
{{- $s := int .Values.gateway.shutdownTimeoutSeconds }}
{{- if le $s 0 }}{{ $s = add (int .Values.gateway.upstreamTimeoutSeconds) 5 }}{{ end }}
{{- $s }}
{{- end }}

{{/* The routes file's text: routes as given, or an object as YAML. */}}
{{- define "retrysafe.routesFile" -}}
{{- if kindIs "string" .Values.routes }}
{{- .Values.routes }}
{{- else if .Values.routes }}
{{- toYaml .Values.routes }}
{{- end }}
{{- end }}

{{- define "retrysafe.probeScheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

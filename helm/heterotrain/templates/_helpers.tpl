{{/* Chart name, truncated to a DNS label. */}}
{{- define "heterotrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: <release>-heterotrain, or the release name if it already has the chart name. */}}
{{- define "heterotrain.fullname" -}}
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

{{- define "heterotrain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator's pods; never change them on upgrade. */}}
{{- define "heterotrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "heterotrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "heterotrain.labels" -}}
helm.sh/chart: {{ include "heterotrain.chart" . }}
{{ include "heterotrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: heterotrain
{{- end }}

{{- define "heterotrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "heterotrain.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "heterotrain.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Name of the kopf peering object the replicas elect a leader through. */}}
{{- define "heterotrain.peeringName" -}}
{{- include "heterotrain.fullname" . }}
{{- end }}

{{/* Leader election is needed as soon as two replicas could run at once. */}}
{{- define "heterotrain.peeringEnabled" -}}
{{- if gt (int .Values.replicaCount) 1 }}true{{ end }}
{{- end }}

{{/* Labels of the worker pods the operator creates (see the launcher); the PodMonitor selects them. */}}
{{- define "heterotrain.workerSelector" -}}
app.kubernetes.io/managed-by: heterotrain-operator
{{- end }}

{{/*
The operator's settings as options of `heterotrain operator`: `--GROUP.KEY=VALUE` (kebab-case), a
boolean as `--GROUP.KEY` or `--no-GROUP.KEY`, nested groups recursively.
*/}}
{{- define "heterotrain.settingsArgs" -}}
{{- $prefix := .prefix -}}
{{- range $key, $value := .values -}}
{{- $name := ternary (kebabcase $key) (printf "%s.%s" $prefix (kebabcase $key)) (eq $prefix "") -}}
{{- if kindIs "map" $value -}}
{{- include "heterotrain.settingsArgs" (dict "prefix" $name "values" $value) -}}
{{- else if kindIs "bool" $value }}
- {{ ternary (printf "--%s" $name) (printf "--no-%s" $name) $value }}
{{- else }}
- --{{ $name }}={{ $value }}
{{- end -}}
{{- end -}}
{{- end -}}

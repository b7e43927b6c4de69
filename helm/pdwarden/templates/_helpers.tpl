{{/* Names and labels shared by every template. */}}

{{- define "pdwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdwarden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "pdwarden.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "pdwarden.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pdwarden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "pdwarden.labels" -}}
{{ include "pdwarden.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pdwarden
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "pdwarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pdwarden.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pdwarden.tokenKeySecret" -}}
{{- default (printf "%s-token-key" (include "pdwarden.fullname" .)) .Values.tokenKey.existingSecret -}}
{{- end -}}

{{- define "pdwarden.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Namespaces that get NetworkPolicies: explicit, else the watched ones. */}}
{{- define "pdwarden.networkPolicyNamespaces" -}}
{{- $ns := .Values.networkPolicy.namespaces | default .Values.watchNamespaces -}}
{{- toJson $ns -}}
{{- end -}}

{{/* Cross-field checks the JSON schema cannot express; called from deployment.yaml. */}}
{{- define "pdwarden.validate" -}}
{{- if eq (int .Values.metrics.port) (int .Values.livenessPort) -}}
{{- fail (printf "metrics.port and livenessPort must differ (both are %v): the operator serves /metrics and /healthz on separate ports" .Values.metrics.port) -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled (not (.Values.networkPolicy.namespaces | default .Values.watchNamespaces)) -}}
{{- fail "networkPolicy.enabled needs networkPolicy.namespaces (or watchNamespaces): in cluster-wide mode the chart cannot know which namespaces run workers" -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled (not .Values.networkPolicy.extraFrom) -}}
{{- fail "networkPolicy.enabled needs networkPolicy.extraFrom: the operator already admits each deployment's own pods and itself; this policy only lets extra peers in" -}}
{{- end -}}
{{- with .Values.shard -}}
{{- $part := splitList "/" . -}}
{{- if or (lt (atoi (index $part 1)) 1) (ge (atoi (index $part 0)) (atoi (index $part 1))) -}}
{{- fail (printf "shard %q: must be INDEX/COUNT with 0 <= INDEX < COUNT (pdwarden run --shard)" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

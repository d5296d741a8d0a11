{{/* Names and labels shared by every template. */}}
{{- define "elastico.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "elastico.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "elastico.extender" -}}{{ include "elastico.fullname" . }}-extender{{- end -}}
{{- define "elastico.webhookService" -}}{{ include "elastico.fullname" . }}-webhook{{- end -}}
{{- define "elastico.scheduler" -}}{{ include "elastico.fullname" . }}-scheduler{{- end -}}
{{- define "elastico.learned" -}}{{ include "elastico.fullname" . }}-learned{{- end -}}
{{- define "elastico.agent" -}}{{ include "elastico.fullname" . }}-agent{{- end -}}
{{- define "elastico.serverSecret" -}}
{{- if eq .Values.tls.mode "existing" -}}{{ required "tls.existing.serverSecret is required in existing mode" .Values.tls.existing.serverSecret }}{{- else -}}{{ include "elastico.fullname" . }}-extender-tls{{- end -}}
{{- end -}}
{{- define "elastico.clientSecret" -}}
{{- if eq .Values.tls.mode "existing" -}}{{ required "tls.existing.clientSecret is required in existing mode" .Values.tls.existing.clientSecret }}{{- else -}}{{ include "elastico.fullname" . }}-scheduler-client-tls{{- end -}}
{{- end -}}
{{- define "elastico.tokenSecret" -}}
{{- default (printf "%s-token" (include "elastico.fullname" .)) .Values.token.existingSecret -}}
{{- end -}}

{{- define "elastico.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{- define "elastico.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: elastico
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* selectorLabels COMPONENT: the labels a Service or PDB selects a component's pods by. */}}
{{- define "elastico.selectorLabels" -}}
app.kubernetes.io/name: elastico
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The MutatingWebhookConfiguration; rendered from tls.yaml, which knows the CA bundle. */}}
{{- define "elastico.webhookConfiguration" -}}
{{- $root := .root -}}
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: {{ include "elastico.fullname" $root }}-pod-settings
  labels: {{- include "elastico.labels" $root | nindent 4 }}
  {{- if .injectFrom }}
  annotations:
    cert-manager.io/inject-ca-from: {{ .injectFrom }}
  {{- end }}
webhooks:
  - name: pods.elastico.io
    admissionReviewVersions: ["v1"]
    sideEffects: None
    failurePolicy: {{ $root.Values.webhook.failurePolicy }}
    timeoutSeconds: {{ $root.Values.webhook.timeoutSeconds }}
    reinvocationPolicy: Never
    clientConfig:
      service:
        name: {{ include "elastico.webhookService" $root }}
        namespace: {{ include "elastico.namespace" $root }}
        port: 8443
        path: /mutate
      {{- if .caBundle }}
      caBundle: {{ .caBundle }}
      {{- end }}
    rules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods"]
        scope: Namespaced
    namespaceSelector:
      matchExpressions:
        - key: kubernetes.io/metadata.name
          operator: NotIn
          values: {{- toYaml (append $root.Values.webhook.excludeNamespaces (include "elastico.namespace" $root)) | nindent 12 }}
    # Only pods that ask for the ElastiCo scheduler reach the webhook: failurePolicy applies
    # to them alone, never to the rest of the cluster's pods.
    matchConditions:
      - name: elastico-scheduler-pods
        expression: {{ printf "object.spec.schedulerName == '%s'" $root.Values.scheduler.name | quote }}
{{- end -}}

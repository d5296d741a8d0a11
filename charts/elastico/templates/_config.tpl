{{/* The files the extender and kube-scheduler read once at start: rendered into their
ConfigMaps and hashed into their pod templates, so that a change rolls the pods. */}}
{{- define "elastico.extenderSettings" -}}
{{- $ns := include "elastico.namespace" . }}
{{- $le := .Values.extender.leaderElection }}
{{- $settings := deepCopy .Values.extender.settings }}
{{- $_ := set $settings "scheduler_name" .Values.scheduler.name }}
{{- $_ := set $settings "leader_election" (and $le.enabled (gt (int .Values.extender.replicas) 0)) }}
{{- $_ := set $settings "lease_name" (include "elastico.extender" .) }}
{{- $_ := set $settings "lease_namespace" $ns }}
{{- with .Values.extender.settings.learned_namespace }}{{ if ne . $ns }}
{{- fail (printf "extender.settings.learned_namespace is %q: the chart's Role covers the checkpoint in the release namespace %q only; unset it" . $ns) }}
{{- end }}{{ end }}
{{- $_ := set $settings "learned_configmap" (include "elastico.learned" .) }}
{{- $_ := set $settings "lease_duration_seconds" $le.leaseDurationSeconds }}
{{- $_ := set $settings "renew_deadline_seconds" $le.renewDeadlineSeconds }}
{{- $_ := set $settings "retry_period_seconds" $le.retryPeriodSeconds }}
{{- if not (has .Values.rings.volume (list "emptyDir" "hostPath")) }}
{{- fail (printf "rings.volume must be emptyDir or hostPath, got %q" .Values.rings.volume) }}
{{- end }}
{{- $_ := set $settings "rings_volume" .Values.rings.volume }}
{{- $_ := set $settings "rings_medium" (.Values.rings.medium | default "") }}
{{- $_ := set $settings "rings_size_limit" (.Values.rings.sizeLimit | default "" | toString) }}
{{- $_ := set $settings "rings_host_path" .Values.rings.hostPath }}
{{- if not (has .Values.agent.authentication (list "serviceaccount" "shared")) }}
{{- fail (printf "agent.authentication must be serviceaccount or shared, got %q" .Values.agent.authentication) }}
{{- end }}
{{- $_ := set $settings "agent_auth" .Values.agent.authentication }}
{{- $_ := set $settings "agent_token_audience" .Values.agent.tokenAudience }}
{{- $_ := set $settings "agent_service_account" (printf "%s:%s" $ns (include "elastico.agent" .)) }}
{{- if .Values.predictor.configMap }}
{{- $_ := set $settings "predictor_model" (printf "/etc/elastico/model/%s" .Values.predictor.key) }}
{{- end }}
{{- toYaml $settings }}
{{- end -}}

{{- define "elastico.schedulerConfig" -}}
{{- $ns := include "elastico.namespace" . -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceName: {{ include "elastico.scheduler" . }}
  resourceNamespace: {{ $ns }}
profiles:
  - schedulerName: {{ .Values.scheduler.name }}
extenders:
  - urlPrefix: https://{{ include "elastico.extender" . }}.{{ $ns }}.svc:8888/scheduler
    filterVerb: filter
    prioritizeVerb: prioritize
    bindVerb: bind
    weight: 5
    enableHTTPS: true
    # Nodes arrive as names only; the extender reads node objects from its own watch.
    nodeCacheCapable: true
    httpTimeout: {{ .Values.scheduler.httpTimeout }}
    # false: with no extender answering, ElastiCo pods stay Pending (and are retried)
    # rather than being bound without a GPU decision (docs/high-availability.md).
    ignorable: {{ .Values.scheduler.extenderIgnorable }}
    managedResources:
      # The extender accounts GPUs itself (sharing); the scheduler must not count them.
      - name: nvidia.com/gpu
        ignoredByScheduler: true
    tlsConfig:
      certFile: /etc/elastico/client/tls.crt
      keyFile: /etc/elastico/client/tls.key
      caFile: /etc/elastico/client/ca.crt
{{- end -}}

{{- /* Where the certificates come from. Each process loads its certificates and CA once:
another source (another CA) must roll every pod that uses them. */}}
{{- define "elastico.tlsChecksum" -}}
{{- toYaml (pick .Values.tls "mode" "certManager" "existing") | sha256sum | trunc 16 -}}
{{- end -}}

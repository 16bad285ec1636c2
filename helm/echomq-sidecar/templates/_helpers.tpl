{{/*
Helpers. The public ones, meant for other charts, are `echomq-sidecar.container`
and `echomq-sidecar.terminationGracePeriodSeconds`; they take this chart's
context: `.` inside this chart, `(index .Subcharts "echomq-sidecar")` in a chart
that lists this one as a dependency (the key is the alias when one is set).
*/}}

{{/* The chart name, shortened to the 63 characters a label allows. */}}
{{- define "echomq-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name, `<release>-<chart>`, or the release name alone when it already
contains the chart name; at most 63 characters (a DNS label).
*/}}
{{- define "echomq-sidecar.fullname" -}}
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

{{/* `<chart>-<version>` for the helm.sh/chart label. */}}
{{- define "echomq-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "echomq-sidecar.labels" -}}
helm.sh/chart: {{ include "echomq-sidecar.chart" . }}
{{ include "echomq-sidecar.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the example pods; they never change after install. */}}
{{- define "echomq-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "echomq-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The example pods' ServiceAccount name. */}}
{{- define "echomq-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "echomq-sidecar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The sidecar image: repository, then `:tag` (default appVersion), then `@digest` if set. */}}
{{- define "echomq-sidecar.image" -}}
{{- $image := .Values.image }}
{{- $ref := printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- if $image.digest }}
{{- $ref = printf "%s@%s" $ref $image.digest }}
{{- end }}
{{- $ref }}
{{- end }}

{{/* The Secret holding the Redis URL: the existing one, or the chart's own. */}}
{{- define "echomq-sidecar.redisSecretName" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecret }}
{{- else }}
{{- printf "%s-redis" (include "echomq-sidecar.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/* The sidecar's drain grace in whole seconds, rounded up. */}}
{{- define "echomq-sidecar.graceSeconds" -}}
{{- ceil (divf (int64 .Values.sidecar.config.shutdownGraceMs) 1000) | int64 }}
{{- end }}

{{/*
The pod's terminationGracePeriodSeconds. The sidecar's drain after SIGTERM takes
at most the grace plus 10 s (5 s for gRPC connections to close, 5 s for the last
acks to flush; see src/app.rs); the pod must outlast it, or the kubelet kills the
sidecar while it still settles. A set value that does not exceed the drain fails
the render with the reason.
*/}}
{{- define "echomq-sidecar.terminationGracePeriodSeconds" -}}
{{- $drain := add (include "echomq-sidecar.graceSeconds" . | int64) 10 }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $drain .Values.terminationGraceMarginSeconds }}
{{- else if le (int64 .Values.terminationGracePeriodSeconds) $drain }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be longer than the sidecar's drain: sidecar.config.shutdownGraceMs (%d s) + 10 s = %d s. Raise it, or leave it null to derive it." (int64 .Values.terminationGracePeriodSeconds) (include "echomq-sidecar.graceSeconds" . | int64) $drain) }}
{{- else }}
{{- .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
The sidecar container, as one list item (it starts with `- name:`), for a pod's
`containers:` or `initContainers:` list:

  containers:
    {{- include "echomq-sidecar.container" . | nindent 4 }}

The argument is this chart's context, or a dict with it under "context" and
"native" (bool) to override nativeSidecar.enabled:

  initContainers:
    {{- include "echomq-sidecar.container" (dict "context" (index .Subcharts "echomq-sidecar") "native" true) | nindent 4 }}

With native true (or nativeSidecar.enabled) it carries `restartPolicy: Always`
and belongs in `initContainers:` (a native sidecar, Kubernetes 1.29+): it then
starts, and passes its startup probe (Redis reachable), before the app
containers start, and stops after they have stopped.

The consumer name defaults to the pod name: POD_NAME comes from the downward
API and the sidecar uses it when ECHOMQ_CONSUMER_NAME is not set. The Redis URL
comes from a Secret (redis.existingSecret, or the one this chart creates). All
probes use the admin port; the gRPC port is loopback-only and not probed.
*/}}
{{- define "echomq-sidecar.container" -}}
{{- $ctx := . }}
{{- $native := false }}
{{- if hasKey . "context" }}
{{- $ctx = .context }}
{{- end }}
{{- $v := $ctx.Values }}
{{- $native = $v.nativeSidecar.enabled }}
{{- if and (hasKey . "native") (not (kindIs "invalid" .native)) }}
{{- $native = .native }}
{{- end }}
{{- $c := $v.sidecar.config }}
- name: {{ $v.sidecar.name }}
  image: {{ include "echomq-sidecar.image" $ctx | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if $native }}
  restartPolicy: Always
  {{- end }}
  {{- with $v.sidecar.extraArgs }}
  args:
    {{- range . }}
    - {{ . | quote }}
    {{- end }}
  {{- end }}
  ports:
    - name: admin
      containerPort: {{ $c.adminPort }}
      protocol: TCP
  env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    {{- with $c.consumerName }}
    - name: ECHOMQ_CONSUMER_NAME
      value: {{ . | quote }}
    {{- end }}
    - name: ECHOMQ_REDIS_URL
      valueFrom:
        secretKeyRef:
          name: {{ include "echomq-sidecar.redisSecretName" $ctx }}
          key: {{ $v.redis.secretKey }}
    - name: ECHOMQ_LISTEN
      value: {{ $c.listen | quote }}
    - name: ECHOMQ_ADMIN_LISTEN
      value: {{ printf "%s:%d" $c.adminHost (int64 $c.adminPort) | quote }}
    - name: ECHOMQ_RECLAIM_MIN_IDLE_MS
      value: {{ $c.reclaimMinIdleMs | int64 | quote }}
    - name: ECHOMQ_RECLAIM_INTERVAL_MS
      value: {{ $c.reclaimIntervalMs | int64 | quote }}
    - name: ECHOMQ_SHUTDOWN_GRACE_MS
      value: {{ $c.shutdownGraceMs | int64 | quote }}
    - name: ECHOMQ_RETRY_BACKOFF_INITIAL_MS
      value: {{ $c.retryBackoffInitialMs | int64 | quote }}
    - name: ECHOMQ_RETRY_BACKOFF_MAX_MS
      value: {{ $c.retryBackoffMaxMs | int64 | quote }}
    - name: ECHOMQ_READ_BLOCK_MS
      value: {{ $c.readBlockMs | int64 | quote }}
    - name: ECHOMQ_REDIS_TIMEOUT_MS
      value: {{ $c.redisTimeoutMs | int64 | quote }}
    - name: ECHOMQ_CONSUMER_IDLE_LIMIT_MS
      value: {{ $c.consumerIdleLimitMs | int64 | quote }}
    - name: ECHOMQ_METRICS_POLL_INTERVAL_MS
      value: {{ $c.metricsPollIntervalMs | int64 | quote }}
    - name: ECHOMQ_DEFAULT_MAX_IN_FLIGHT
      value: {{ $c.defaultMaxInFlight | int64 | quote }}
    - name: ECHOMQ_MAX_IN_FLIGHT_LIMIT
      value: {{ $c.maxInFlightLimit | int64 | quote }}
    - name: ECHOMQ_DEFAULT_MAX_DELIVERIES
      value: {{ $c.defaultMaxDeliveries | int64 | quote }}
    - name: ECHOMQ_ID_FIELD
      value: {{ $c.idField | quote }}
    - name: ECHOMQ_LOG
      value: {{ $c.log | quote }}
    - name: ECHOMQ_LOG_FORMAT
      value: {{ $c.logFormat | quote }}
    {{- with $v.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if $v.sidecar.startupProbe.enabled }}
  startupProbe:
    httpGet:
      path: /readyz
      port: admin
    periodSeconds: {{ $v.sidecar.startupProbe.periodSeconds }}
    timeoutSeconds: {{ $v.sidecar.startupProbe.timeoutSeconds }}
    failureThreshold: {{ $v.sidecar.startupProbe.failureThreshold }}
  {{- end }}
  livenessProbe:
    httpGet:
      path: /livez
      port: admin
    periodSeconds: {{ $v.sidecar.livenessProbe.periodSeconds }}
    timeoutSeconds: {{ $v.sidecar.livenessProbe.timeoutSeconds }}
    failureThreshold: {{ $v.sidecar.livenessProbe.failureThreshold }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    periodSeconds: {{ $v.sidecar.readinessProbe.periodSeconds }}
    timeoutSeconds: {{ $v.sidecar.readinessProbe.timeoutSeconds }}
    failureThreshold: {{ $v.sidecar.readinessProbe.failureThreshold }}
  {{- with $v.sidecar.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.containerSecurityContext | nindent 4 }}
  {{- with $v.sidecar.extraVolumeMounts }}
  volumeMounts:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
Helpers. The public ones, meant for other charts, are `echomq-sidecar.container`,
`echomq-sidecar.volumes` and `echomq-sidecar.terminationGracePeriodSeconds`, and
for an app container that calls the sidecar with the chart's token and TLS
settings, `echomq-sidecar.clientEnv`, `echomq-sidecar.clientVolumeMounts` and
`echomq-sidecar.clientVolumes`. They take this chart's context: `.` inside this
chart, `(index .Subcharts "echomq-sidecar")` in a chart that lists this one as a
dependency (the key is the alias when one is set).
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
ECHOMQ_ADMIN_LISTEN: `host:port`, an IPv6 host in brackets (`[::]:9464`), since
the sidecar parses a socket address (`:::9464` is not one).
*/}}
{{- define "echomq-sidecar.adminListen" -}}
{{- $c := .Values.sidecar.config }}
{{- $host := $c.adminHost }}
{{- if and (contains ":" $host) (not (hasPrefix "[" $host)) }}
{{- $host = printf "[%s]" $host }}
{{- end }}
{{- printf "%s:%d" $host (int64 $c.adminPort) }}
{{- end }}

{{/* Where the sidecar's Secret files are mounted, and where its clients' are. */}}
{{- define "echomq-sidecar.secretsDir" -}}/etc/echomq{{- end }}
{{- define "echomq-sidecar.clientSecretsDir" -}}/etc/echomq-client{{- end }}

{{/* Whether the sidecar mounts any Secret file: "true" or "". */}}
{{- define "echomq-sidecar.hasSecretFiles" -}}
{{- $v := .Values }}
{{- if or $v.sidecar.auth.enabled $v.sidecar.tls.enabled $v.redis.password.enabled $v.redis.ca.enabled $v.redis.sentinel.password.enabled }}true{{ end }}
{{- end }}

{{/* Whether the sidecar's clients need any Secret file (token, CA): "true" or "". */}}
{{- define "echomq-sidecar.hasClientSecretFiles" -}}
{{- if or .Values.sidecar.auth.enabled .Values.sidecar.tls.enabled }}true{{ end }}
{{- end }}

{{/*
The pod volumes the sidecar container needs, as list items (empty when none):
one projected volume, `echomq-sidecar-secrets`, with the files of the token,
TLS, Redis password, Redis CA and Sentinel password Secrets that are enabled,
read-only with mode sidecar.secretFileMode. Add it to every pod that carries the sidecar:

  volumes:
    {{- include "echomq-sidecar.volumes" (index .Subcharts "echomq-sidecar") | nindent 4 }}
*/}}
{{- define "echomq-sidecar.volumes" -}}
{{- $v := .Values }}
{{- $s := $v.sidecar }}
{{- if include "echomq-sidecar.hasSecretFiles" . -}}
- name: echomq-sidecar-secrets
  projected:
    defaultMode: {{ int64 $s.secretFileMode }}
    sources:
      {{- if $s.auth.enabled }}
      - secret:
          name: {{ required "sidecar.auth.secretName is required when sidecar.auth.enabled is true" $s.auth.secretName }}
          items:
            - key: {{ $s.auth.secretKey }}
              path: auth/token
      {{- end }}
      {{- if $s.tls.enabled }}
      - secret:
          name: {{ required "sidecar.tls.secretName is required when sidecar.tls.enabled is true" $s.tls.secretName }}
          items:
            - key: {{ $s.tls.certKey }}
              path: tls/tls.crt
            - key: {{ $s.tls.keyKey }}
              path: tls/tls.key
      {{- if $s.tls.clientAuth.enabled }}
      - secret:
          name: {{ default $s.tls.secretName $s.tls.clientAuth.caSecretName }}
          items:
            - key: {{ $s.tls.clientAuth.caKey }}
              path: tls/client-ca.crt
      {{- end }}
      {{- end }}
      {{- if $v.redis.password.enabled }}
      - secret:
          name: {{ required "redis.password.secretName is required when redis.password.enabled is true" $v.redis.password.secretName }}
          items:
            - key: {{ $v.redis.password.secretKey }}
              path: redis/password
      {{- end }}
      {{- if $v.redis.ca.enabled }}
      - secret:
          name: {{ required "redis.ca.secretName is required when redis.ca.enabled is true" $v.redis.ca.secretName }}
          items:
            - key: {{ $v.redis.ca.secretKey }}
              path: redis/ca.crt
      {{- end }}
      {{- if $v.redis.sentinel.password.enabled }}
      - secret:
          name: {{ required "redis.sentinel.password.secretName is required when redis.sentinel.password.enabled is true" $v.redis.sentinel.password.secretName }}
          items:
            - key: {{ $v.redis.sentinel.password.secretKey }}
              path: redis/sentinel-password
      {{- end }}
{{- end }}
{{- end }}

{{/*
The pod volumes of a client of the sidecar (the chart's tests and demo app, or
your app), as list items (empty when none): one projected volume,
`echomq-client-secrets`, with the bearer token (sidecar.auth), the CA that
signed the sidecar's certificate (sidecar.tls.caKey) and, with mTLS, the client
certificate and key (sidecar.tls.clientAuth.clientSecretName). Never the
sidecar's own private key.
*/}}
{{- define "echomq-sidecar.clientVolumes" -}}
{{- $s := .Values.sidecar }}
{{- if include "echomq-sidecar.hasClientSecretFiles" . -}}
- name: echomq-client-secrets
  projected:
    defaultMode: {{ int64 $s.secretFileMode }}
    sources:
      {{- if $s.auth.enabled }}
      - secret:
          name: {{ required "sidecar.auth.secretName is required when sidecar.auth.enabled is true" $s.auth.secretName }}
          items:
            - key: {{ $s.auth.secretKey }}
              path: token
      {{- end }}
      {{- if $s.tls.enabled }}
      - secret:
          name: {{ required "sidecar.tls.secretName is required when sidecar.tls.enabled is true" $s.tls.secretName }}
          items:
            - key: {{ $s.tls.caKey }}
              path: ca.crt
      {{- if $s.tls.clientAuth.enabled }}
      - secret:
          name: {{ required "sidecar.tls.clientAuth.clientSecretName is required when sidecar.tls.clientAuth.enabled is true and the chart's tests or example run: the client certificate (a kubernetes.io/tls Secret) they present to the sidecar" $s.tls.clientAuth.clientSecretName }}
          items:
            - key: tls.crt
              path: tls.crt
            - key: tls.key
              path: tls.key
      {{- end }}
      {{- end }}
{{- end }}
{{- end }}

{{/* The volume mounts of a client of the sidecar (list items; empty when none). */}}
{{- define "echomq-sidecar.clientVolumeMounts" -}}
{{- if include "echomq-sidecar.hasClientSecretFiles" . -}}
- name: echomq-client-secrets
  mountPath: {{ include "echomq-sidecar.clientSecretsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
The environment of a client of the sidecar (list items; empty when none): the
files the chart's scripts (files/tests/grpc-client.sh) hand to grpcurl.
ECHOMQ_CLIENT_TOKEN_FILE: send `authorization: Bearer <its content>`;
ECHOMQ_CLIENT_CA_FILE: use TLS, trusting this CA; ECHOMQ_CLIENT_SERVER_NAME: the
name to verify in the sidecar's certificate; ECHOMQ_CLIENT_CERT_FILE and
ECHOMQ_CLIENT_KEY_FILE: the client certificate (mTLS). And, with an archive
(archive.url), ECHOMQ_APPEND_MAX_LEN=0: the sidecar refuses an Append's
max_len then, so the chart's scripts append without it.
*/}}
{{- define "echomq-sidecar.clientEnv" -}}
{{- $s := .Values.sidecar }}
{{- $dir := include "echomq-sidecar.clientSecretsDir" . }}
{{- $env := list }}
{{- if $s.auth.enabled }}
{{- $env = append $env (dict "name" "ECHOMQ_CLIENT_TOKEN_FILE" "value" (printf "%s/token" $dir)) }}
{{- end }}
{{- if $s.tls.enabled }}
{{- $env = append $env (dict "name" "ECHOMQ_CLIENT_CA_FILE" "value" (printf "%s/ca.crt" $dir)) }}
{{- with $s.tls.serverName }}
{{- $env = append $env (dict "name" "ECHOMQ_CLIENT_SERVER_NAME" "value" .) }}
{{- end }}
{{- if $s.tls.clientAuth.enabled }}
{{- $env = append $env (dict "name" "ECHOMQ_CLIENT_CERT_FILE" "value" (printf "%s/tls.crt" $dir)) }}
{{- $env = append $env (dict "name" "ECHOMQ_CLIENT_KEY_FILE" "value" (printf "%s/tls.key" $dir)) }}
{{- end }}
{{- end }}
{{- if .Values.archive.url }}
{{- $env = append $env (dict "name" "ECHOMQ_APPEND_MAX_LEN" "value" "0") }}
{{- end }}
{{- with $env }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
The sidecar container, as one list item (it starts with `- name:`), for a pod's
`containers:` or `initContainers:` list:

  containers:
    {{- include "echomq-sidecar.container" . | nindent 4 }}

The argument is this chart's context, or a dict with it under "context" and,
optionally, "native" (bool) to override nativeSidecar.enabled and "replicas"
(the pod count of the workload, to refuse a fixed consumer name shared by
several pods), and "keda" (bool: the KEDA scaler's sidecar, serving only
the scaler on keda.scaler.grpcPort on the admin port's interface with
ECHOMQ_KEDA_SCALER_LISTEN, its gRPC port left on loopback, and no retention
or archive of its own; only templates/keda.yaml sets it):

  initContainers:
    {{- include "echomq-sidecar.container" (dict "context" (index .Subcharts "echomq-sidecar") "native" true "replicas" .Values.replicaCount) | nindent 4 }}

With native true (or nativeSidecar.enabled) it carries `restartPolicy: Always`
and belongs in `initContainers:` (a native sidecar, Kubernetes 1.29+): it then
starts, and passes its startup probe (Redis reachable), before the app
containers start, and stops after they have stopped.

The consumer name defaults to the pod name: POD_NAME comes from the downward
API and the sidecar uses it when ECHOMQ_CONSUMER_NAME is not set. The Redis URL
comes from a Secret (redis.existingSecret, or the one this chart creates). All
probes use the admin port; the gRPC port is loopback-only and not probed. The
token, TLS, Redis password/CA and Sentinel password files come from the volume
that `echomq-sidecar.volumes` renders: the pod must list it.
*/}}
{{- define "echomq-sidecar.container" -}}
{{- $ctx := . }}
{{- $native := false }}
{{- $replicas := 1 }}
{{- if hasKey . "context" }}
{{- $ctx = .context }}
{{- if and (hasKey . "replicas") (not (kindIs "invalid" .replicas)) }}
{{- $replicas = int64 .replicas }}
{{- end }}
{{- end }}
{{- $v := $ctx.Values }}
{{- $native = $v.nativeSidecar.enabled }}
{{- if and (hasKey . "native") (not (kindIs "invalid" .native)) }}
{{- $native = .native }}
{{- end }}
{{- $c := $v.sidecar.config }}
{{- $s := $v.sidecar }}
{{- /* The KEDA scaler's sidecar: KEDA's operator dials the scaler from
another pod, so the scaler's own port listens where the admin port does
(see keda.yaml); the gRPC port, with every other call, stays where it was. */}}
{{- $keda := and (hasKey . "keda") .keda }}
{{- $listen := $c.listen }}
{{- $scalerListen := "" }}
{{- if $keda }}
{{- $adminHost := include "echomq-sidecar.adminListen" $ctx | trimSuffix (printf ":%d" (int64 $c.adminPort)) }}
{{- $scalerListen = printf "%s:%d" $adminHost (int64 $v.keda.scaler.grpcPort) }}
{{- end }}
{{- if and $c.consumerName (gt (int64 $replicas) 1) }}
{{- fail (printf "sidecar.config.consumerName (%q) is fixed, but %d pods would run the sidecar: every pod would be the same consumer of each group, and two consumers with one name hand entries to each other's calls. Leave consumerName empty (each pod is a consumer named after itself) or run one replica." $c.consumerName (int64 $replicas)) }}
{{- end }}
{{- range $s.extraEnv }}
{{- if and (has .name (list "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" "AWS_SESSION_TOKEN")) (hasKey . "value") }}
{{- fail (printf "sidecar.extraEnv sets %s as a plain value: S3 credentials belong in a Secret; name it with archive.existingSecret (keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally AWS_SESSION_TOKEN)" .name) }}
{{- end }}
{{- end }}
{{- $dir := include "echomq-sidecar.secretsDir" $ctx -}}
- name: {{ $s.name }}
  image: {{ include "echomq-sidecar.image" $ctx | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if $native }}
  restartPolicy: Always
  {{- end }}
  {{- with $s.extraArgs }}
  args:
    {{- range . }}
    - {{ . | quote }}
    {{- end }}
  {{- end }}
  ports:
    - name: admin
      containerPort: {{ $c.adminPort }}
      protocol: TCP
    {{- if $keda }}
    - name: grpc
      containerPort: {{ $v.keda.scaler.grpcPort }}
      protocol: TCP
    {{- end }}
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
    {{- if $v.redis.password.enabled }}
    - name: ECHOMQ_REDIS_PASSWORD_FILE
      value: {{ printf "%s/redis/password" $dir | quote }}
    {{- end }}
    {{- if $v.redis.ca.enabled }}
    - name: ECHOMQ_REDIS_CA_FILE
      value: {{ printf "%s/redis/ca.crt" $dir | quote }}
    {{- end }}
    {{- with $v.redis.sentinel.username }}
    - name: ECHOMQ_SENTINEL_USERNAME
      value: {{ . | quote }}
    {{- end }}
    {{- if $v.redis.sentinel.password.enabled }}
    - name: ECHOMQ_SENTINEL_PASSWORD_FILE
      value: {{ printf "%s/redis/sentinel-password" $dir | quote }}
    {{- end }}
    - name: ECHOMQ_LISTEN
      value: {{ $listen | quote }}
    {{- if $keda }}
    - name: ECHOMQ_KEDA_SCALER_LISTEN
      value: {{ $scalerListen | quote }}
    {{- end }}
    - name: ECHOMQ_ADMIN_LISTEN
      value: {{ include "echomq-sidecar.adminListen" $ctx | quote }}
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
    - name: ECHOMQ_MAX_MESSAGE_BYTES
      value: {{ $c.maxMessageBytes | int64 | quote }}
    - name: ECHOMQ_MAX_FIELDS_PER_ENTRY
      value: {{ $c.maxFieldsPerEntry | int64 | quote }}
    - name: ECHOMQ_MAX_NAME_BYTES
      value: {{ $c.maxNameBytes | int64 | quote }}
    - name: ECHOMQ_MAX_CONSUME_CALLS
      value: {{ $c.maxConsumeCalls | int64 | quote }}
    {{- with $c.readerConnections }}
    - name: ECHOMQ_READER_CONNECTIONS
      value: {{ . | int64 | quote }}
    {{- end }}
    {{- with $c.sharedReaderConnections }}
    - name: ECHOMQ_SHARED_READER_CONNECTIONS
      value: {{ . | int64 | quote }}
    {{- end }}
    - name: ECHOMQ_SHARED_READERS
      value: {{ $c.sharedReaders | quote }}
    - name: ECHOMQ_WAIT_REPLICAS
      value: {{ $c.waitReplicas | int64 | quote }}
    - name: ECHOMQ_WAIT_TIMEOUT_MS
      value: {{ $c.waitTimeoutMs | int64 | quote }}
    - name: ECHOMQ_WAIT_AOF
      value: {{ $c.waitAof | toString | quote }}
    - name: ECHOMQ_DEDUP_WINDOW_MS
      value: {{ $c.dedupWindowMs | int64 | quote }}
    {{- if $keda }}
    {{- /* The scaler answers callers with no token: it may name its one stream only. */}}
    - name: ECHOMQ_ALLOW_STREAMS
      value: {{ $v.keda.stream | quote }}
    {{- else }}
    {{- with $c.allowStreams }}
    - name: ECHOMQ_ALLOW_STREAMS
      value: {{ join "," . | quote }}
    {{- end }}
    {{- end }}
    {{- with $c.allowStreamsFor }}
    {{- $rules := list }}
    {{- range . }}
    {{- $rules = append $rules (printf "%s=%s" .identity (join "," .streams)) }}
    {{- end }}
    - name: ECHOMQ_ALLOW_STREAMS_FOR
      value: {{ join ";" $rules | quote }}
    {{- end }}
    {{- /* The scaler consumes nothing: it folds and trims nothing either. */}}
    {{- if not $keda }}
    {{- with $v.archive.url }}
    - name: ECHOMQ_ARCHIVE_URL
      value: {{ . | quote }}
    - name: ECHOMQ_ARCHIVE_FILE_ENTRIES
      value: {{ $v.archive.fileEntries | int64 | quote }}
    - name: ECHOMQ_ARCHIVE_PARTIAL_FILE_INTERVAL_MS
      value: {{ $v.archive.partialFileIntervalMs | int64 | quote }}
    {{- if hasPrefix "s3://" . }}
    {{- with $v.archive.s3.endpoint }}
    - name: AWS_ENDPOINT_URL
      value: {{ . | quote }}
    {{- end }}
    {{- with $v.archive.s3.region }}
    - name: AWS_REGION
      value: {{ . | quote }}
    {{- end }}
    {{- if $v.archive.s3.allowHttp }}
    - name: AWS_ALLOW_HTTP
      value: "true"
    {{- end }}
    {{- with $v.archive.existingSecret }}
    {{- /* Credentials only by reference to the Secret: never a value of the chart. */}}
    - name: AWS_ACCESS_KEY_ID
      valueFrom:
        secretKeyRef:
          name: {{ . }}
          key: AWS_ACCESS_KEY_ID
    - name: AWS_SECRET_ACCESS_KEY
      valueFrom:
        secretKeyRef:
          name: {{ . }}
          key: AWS_SECRET_ACCESS_KEY
    - name: AWS_SESSION_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ . }}
          key: AWS_SESSION_TOKEN
          optional: true
    {{- end }}
    {{- end }}
    {{- end }}
    {{- with $c.retention }}
    - name: ECHOMQ_RETENTION
      value: {{ join "," . | quote }}
    - name: ECHOMQ_RETENTION_INTERVAL_MS
      value: {{ $c.retentionIntervalMs | int64 | quote }}
    {{- end }}
    {{- end }}
    {{- if $s.auth.enabled }}
    - name: ECHOMQ_AUTH_TOKEN_FILE
      value: {{ printf "%s/auth/token" $dir | quote }}
    {{- end }}
    {{- if $s.tls.enabled }}
    - name: ECHOMQ_TLS_CERT_FILE
      value: {{ printf "%s/tls/tls.crt" $dir | quote }}
    - name: ECHOMQ_TLS_KEY_FILE
      value: {{ printf "%s/tls/tls.key" $dir | quote }}
    {{- if $s.tls.clientAuth.enabled }}
    - name: ECHOMQ_TLS_CLIENT_CA_FILE
      value: {{ printf "%s/tls/client-ca.crt" $dir | quote }}
    {{- end }}
    {{- end }}
    - name: ECHOMQ_LOG
      value: {{ $c.log | quote }}
    - name: ECHOMQ_LOG_FORMAT
      value: {{ $c.logFormat | quote }}
    {{- with $s.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if $s.startupProbe.enabled }}
  startupProbe:
    httpGet:
      path: /readyz
      port: admin
    periodSeconds: {{ $s.startupProbe.periodSeconds }}
    timeoutSeconds: {{ $s.startupProbe.timeoutSeconds }}
    failureThreshold: {{ $s.startupProbe.failureThreshold }}
  {{- end }}
  livenessProbe:
    httpGet:
      path: /livez
      port: admin
    periodSeconds: {{ $s.livenessProbe.periodSeconds }}
    timeoutSeconds: {{ $s.livenessProbe.timeoutSeconds }}
    failureThreshold: {{ $s.livenessProbe.failureThreshold }}
  {{- if $s.readinessProbe.enabled }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    periodSeconds: {{ $s.readinessProbe.periodSeconds }}
    timeoutSeconds: {{ $s.readinessProbe.timeoutSeconds }}
    failureThreshold: {{ $s.readinessProbe.failureThreshold }}
  {{- end }}
  {{- with $s.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.containerSecurityContext | nindent 4 }}
  {{- if or (include "echomq-sidecar.hasSecretFiles" $ctx) $s.extraVolumeMounts }}
  volumeMounts:
    {{- if include "echomq-sidecar.hasSecretFiles" $ctx }}
    - name: echomq-sidecar-secrets
      mountPath: {{ $dir }}
      readOnly: true
    {{- end }}
    {{- with $s.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
{{- end }}

{{/*
The parts every chart-test pod shares: hook annotations, the restricted pod
security context, and the client container's settings. The argument is a dict:
"ctx" (the chart context), "name" (the test's name), "script" (the file under
files/tests/ the client runs), "sidecar" (bool: run its own sidecar, as a
native sidecar, beside the client), "env" (extra env of the client, a list) and
"weight" (the hook weight: tests run in weight order). The client also gets the
sidecar's extraVolumeMounts, so it sees a unix socket the sidecar listens on,
and, when it talks gRPC to its sidecar ("sidecar" true), the token, CA and
client certificate files (sidecar.auth, sidecar.tls) with the ECHOMQ_CLIENT_*
variables that point grpcurl at them.
*/}}
{{- define "echomq-sidecar.testPod" -}}
{{- $ctx := .ctx }}
{{- $v := $ctx.Values }}
apiVersion: v1
kind: Pod
metadata:
  name: {{ include "echomq-sidecar.fullname" $ctx | trunc 50 | trimSuffix "-" }}-test-{{ .name }}
  labels:
    {{- include "echomq-sidecar.labels" $ctx | nindent 4 }}
    app.kubernetes.io/component: test
  annotations:
    helm.sh/hook: test
    helm.sh/hook-weight: {{ .weight | quote }}
    # Kept after a run for `helm test --logs`; replaced by the next run.
    helm.sh/hook-delete-policy: before-hook-creation
spec:
  restartPolicy: Never
  # The client gives up after its own timeout; this bounds a hung pull or start too.
  activeDeadlineSeconds: {{ add (mul (int64 $v.tests.timeoutSeconds) 3) 60 }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ include "echomq-sidecar.terminationGracePeriodSeconds" $ctx }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  {{- if .sidecar }}
  # The pod's own sidecar, from the same named template other charts use. As a
  # native sidecar it is ready (startup probe on /readyz) before the client
  # starts, and the pod completes when the client exits.
  initContainers:
    {{- include "echomq-sidecar.container" (dict "context" $ctx "native" true) | nindent 4 }}
  {{- end }}
  containers:
    - name: client
      image: {{ printf "%s:%s" $v.tests.image.repository $v.tests.image.tag | quote }}
      imagePullPolicy: {{ $v.tests.image.pullPolicy }}
      command: ["/bin/sh", "/tests/{{ .script }}"]
      env:
        - name: ECHOMQ_TEST_TIMEOUT
          value: {{ $v.tests.timeoutSeconds | int64 | quote }}
        {{- with .env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- if .sidecar }}
        {{- with include "echomq-sidecar.clientEnv" $ctx }}{{ . | nindent 8 }}{{ end }}
        {{- end }}
      resources:
        requests:
          cpu: 10m
          memory: 16Mi
        limits:
          memory: 64Mi
      securityContext:
        {{- toYaml $v.containerSecurityContext | nindent 8 }}
      volumeMounts:
        - name: tests
          mountPath: /tests
          readOnly: true
        - name: tmp
          mountPath: /tmp
        {{- with $v.sidecar.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- if .sidecar }}
        {{- with include "echomq-sidecar.clientVolumeMounts" $ctx }}{{ . | nindent 8 }}{{ end }}
        {{- end }}
  volumes:
    - name: tests
      configMap:
        name: {{ include "echomq-sidecar.fullname" $ctx | trunc 50 | trimSuffix "-" }}-tests
    - name: tmp
      emptyDir:
        sizeLimit: 16Mi
    {{- with $v.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- if .sidecar }}
    {{- with include "echomq-sidecar.volumes" $ctx }}{{ . | nindent 4 }}{{ end }}
    {{- with include "echomq-sidecar.clientVolumes" $ctx }}{{ . | nindent 4 }}{{ end }}
    {{- end }}
{{- end }}

#!/bin/sh
# Chart test: the sidecar's standard gRPC health service (grpc.health.v1)
# reports SERVING for the server and for each EchoMQ service, and server
# reflection lists the EchoMQ services (so grpcurl works without proto files).
#
# Input: ECHOMQ_SIDECAR_ADDRESS (`host:port` or `unix:/path`, default
# 127.0.0.1:50051), ECHOMQ_TEST_TIMEOUT (seconds, default 60), and the
# ECHOMQ_CLIENT_* variables of grpc-client.sh (token, TLS, client certificate).
# Needs a POSIX shell and grpcurl.
set -eu

timeout=${ECHOMQ_TEST_TIMEOUT:-60}
deadline=$(($(date +%s) + timeout))
# shellcheck source=grpc-client.sh
. "$(dirname "$0")/grpc-client.sh"
echo "calling $(grpc_describe)"
last=$(mktemp "${TMPDIR:-/tmp}/echomq-health.XXXXXX")
trap 'rm -f "$last"' EXIT

for service in "" echomq.v1.ConsumerService echomq.v1.StreamService echomq.v1.AdminService; do
  until grpc -max-time 5 -d "{\"service\":\"$service\"}" "$target" grpc.health.v1.Health/Check >"$last" 2>&1 \
    && grep -q '"status": "SERVING"' "$last"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      # What grpcurl said last: the status (e.g. `Code: Unavailable`) or the TLS error.
      echo "FAIL: health of '${service:-(server)}' is not SERVING after ${timeout}s; the last answer:" >&2
      cat "$last" >&2
      exit 1
    fi
    sleep 1
  done
  echo "ok: grpc.health.v1 says '${service:-(server)}' is SERVING"
done

if ! services=$(grpc -max-time 5 "$target" list 2>&1); then
  echo "FAIL: reflection (grpcurl list) failed: $services" >&2
  exit 1
fi
for service in echomq.v1.ConsumerService echomq.v1.StreamService echomq.v1.AdminService; do
  if ! printf '%s\n' "$services" | grep -qx "$service"; then
    echo "FAIL: reflection does not list $service; it lists: $services" >&2
    exit 1
  fi
done
echo "ok: reflection lists the EchoMQ services"

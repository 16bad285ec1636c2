#!/bin/sh
# Chart test: the sidecar's standard gRPC health service (grpc.health.v1)
# reports SERVING for the server and for each EchoMQ service, and server
# reflection lists the EchoMQ services (so grpcurl works without proto files).
#
# Input: ECHOMQ_SIDECAR_ADDRESS (`host:port` or `unix:/path`, default
# 127.0.0.1:50051), ECHOMQ_TEST_TIMEOUT (seconds, default 60). Needs a POSIX
# shell and grpcurl.
set -eu

addr=${ECHOMQ_SIDECAR_ADDRESS:-127.0.0.1:50051}
timeout=${ECHOMQ_TEST_TIMEOUT:-60}
deadline=$(($(date +%s) + timeout))
case $addr in
  unix:*) unix=-unix target=${addr#unix:} ;;
  *) unix='' target=$addr ;;
esac

grpc() {
  grpcurl -plaintext $unix -max-time 5 "$@"
}

for service in "" echomq.v1.ConsumerService echomq.v1.StreamService echomq.v1.AdminService; do
  until grpc -d "{\"service\":\"$service\"}" "$target" grpc.health.v1.Health/Check 2>/dev/null \
    | grep -q '"status": "SERVING"'; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "FAIL: health of '${service:-(server)}' is not SERVING after ${timeout}s:" >&2
      grpc -d "{\"service\":\"$service\"}" "$target" grpc.health.v1.Health/Check >&2 || true
      exit 1
    fi
    sleep 1
  done
  echo "ok: grpc.health.v1 says '${service:-(server)}' is SERVING"
done

services=$(grpc "$target" list)
for service in echomq.v1.ConsumerService echomq.v1.StreamService echomq.v1.AdminService; do
  if ! printf '%s\n' "$services" | grep -qx "$service"; then
    echo "FAIL: reflection does not list $service; it lists: $services" >&2
    exit 1
  fi
done
echo "ok: reflection lists the EchoMQ services"

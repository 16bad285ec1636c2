# Sourced (not run) by the chart's gRPC clients: files/tests/grpc-health.sh,
# files/tests/roundtrip.sh and files/demo-app.sh. It sets $target, the address
# grpcurl dials, and defines grpc(), which runs grpcurl with the connection
# options that the sidecar's address and the chart's security values call for:
#
#   ECHOMQ_SIDECAR_ADDRESS     `host:port` or `unix:/path` (default 127.0.0.1:50051)
#   ECHOMQ_CLIENT_TOKEN_FILE   send `authorization: Bearer <the file's content>`
#   ECHOMQ_CLIENT_CA_FILE      use TLS, trusting this PEM CA (else plaintext)
#   ECHOMQ_CLIENT_SERVER_NAME  the name to verify in the sidecar's certificate
#   ECHOMQ_CLIENT_CERT_FILE, ECHOMQ_CLIENT_KEY_FILE   present this client
#                              certificate (mTLS)
#
# The chart sets the ECHOMQ_CLIENT_* variables (helper `echomq-sidecar.clientEnv`)
# when sidecar.auth or sidecar.tls is on. Usage: grpc [grpcurl options] "$target" METHOD;
# with grpc_run=exec (in a subshell) grpcurl replaces the shell, so a background
# call's $! is grpcurl's pid.
#
# grpcurl expands ${ECHOMQ_BEARER_TOKEN} in the header itself (-expand-headers),
# so the token is never on a command line.

# shellcheck shell=sh

addr=${ECHOMQ_SIDECAR_ADDRESS:-127.0.0.1:50051}
# shellcheck disable=SC2034 # $target is for the scripts that source this file
case $addr in
  unix:*) grpc_unix=1 target=${addr#unix:} ;;
  *) grpc_unix='' target=$addr ;;
esac

ECHOMQ_BEARER_TOKEN=
if [ -n "${ECHOMQ_CLIENT_TOKEN_FILE:-}" ]; then
  if ! ECHOMQ_BEARER_TOKEN=$(tr -d ' \t\r\n' <"$ECHOMQ_CLIENT_TOKEN_FILE"); then
    echo "FAIL: cannot read the bearer token from ECHOMQ_CLIENT_TOKEN_FILE=$ECHOMQ_CLIENT_TOKEN_FILE" >&2
    exit 1
  fi
  if [ -z "$ECHOMQ_BEARER_TOKEN" ]; then
    echo "FAIL: the token file $ECHOMQ_CLIENT_TOKEN_FILE is empty" >&2
    exit 1
  fi
fi
export ECHOMQ_BEARER_TOKEN
grpc_run=

grpc() {
  if [ -n "${ECHOMQ_CLIENT_CA_FILE:-}" ]; then
    if [ -n "${ECHOMQ_CLIENT_CERT_FILE:-}" ]; then
      set -- -cert "$ECHOMQ_CLIENT_CERT_FILE" -key "${ECHOMQ_CLIENT_KEY_FILE:?set with ECHOMQ_CLIENT_CERT_FILE}" "$@"
    fi
    if [ -n "${ECHOMQ_CLIENT_SERVER_NAME:-}" ]; then
      set -- -servername "$ECHOMQ_CLIENT_SERVER_NAME" "$@"
    fi
    set -- -cacert "$ECHOMQ_CLIENT_CA_FILE" "$@"
  else
    set -- -plaintext "$@"
  fi
  if [ -n "$ECHOMQ_BEARER_TOKEN" ]; then
    # shellcheck disable=SC2016 # grpcurl expands the variable, not the shell
    set -- -expand-headers -H 'authorization: Bearer ${ECHOMQ_BEARER_TOKEN}' "$@"
  fi
  if [ -n "$grpc_unix" ]; then
    set -- -unix "$@"
  fi
  $grpc_run grpcurl "$@"
}

# A one-line description of the connection, for the logs (no secrets).
grpc_describe() {
  mode=plaintext
  if [ -n "${ECHOMQ_CLIENT_CA_FILE:-}" ]; then
    mode="TLS (CA $ECHOMQ_CLIENT_CA_FILE${ECHOMQ_CLIENT_SERVER_NAME:+, server name $ECHOMQ_CLIENT_SERVER_NAME}${ECHOMQ_CLIENT_CERT_FILE:+, client certificate $ECHOMQ_CLIENT_CERT_FILE})"
  fi
  echo "$addr over $mode${ECHOMQ_CLIENT_TOKEN_FILE:+, bearer token from $ECHOMQ_CLIENT_TOKEN_FILE}"
}

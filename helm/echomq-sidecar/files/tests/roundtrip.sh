#!/bin/sh
# Chart test: an append-then-consume round trip through the sidecar.
#
#   1. waits until grpc.health.v1 says SERVING, then checks that the sidecar
#      lets this client use the stream (DescribeGroup: the token, the
#      allow-list; NotFound for a new group is fine);
#   2. opens a Consume call and subscribes to $ECHOMQ_TEST_STREAM through the
#      group $ECHOMQ_TEST_GROUP (new entries only), waits for `subscribed`;
#   3. appends one entry (StreamService/Append) and keeps its branded id;
#   4. waits for the delivery of that id, checks its payload,
#      and acks it (and any leftover delivery of an earlier, failed run);
#   5. closes the call and waits until DescribeGroup reports nothing pending.
#
# A failure says which step failed and what the sidecar answered (the gRPC
# status, e.g. `Code: Unauthenticated` or `Code: PermissionDenied`).
#
# Input: ECHOMQ_SIDECAR_ADDRESS (`host:port` or `unix:/path`, default
# 127.0.0.1:50051), ECHOMQ_TEST_STREAM, ECHOMQ_TEST_GROUP, ECHOMQ_TEST_TIMEOUT
# (seconds per step, default 60), ECHOMQ_APPEND_MAX_LEN (the Append's max_len,
# default 100; 0 appends without one, as a sidecar with an archive demands),
# and the ECHOMQ_CLIENT_* variables of
# grpc-client.sh (token, TLS, client certificate). Needs a POSIX shell,
# grpcurl, base64, mkfifo.
set -eu

stream=${ECHOMQ_TEST_STREAM:-echomq-chart-test}
group=${ECHOMQ_TEST_GROUP:-echomq-chart-test}
timeout=${ECHOMQ_TEST_TIMEOUT:-60}
max_len=${ECHOMQ_APPEND_MAX_LEN:-100}
work=$(mktemp -d "${TMPDIR:-/tmp}/echomq-roundtrip.XXXXXX")
# shellcheck source=grpc-client.sh
. "$(dirname "$0")/grpc-client.sh"
echo "calling $(grpc_describe)"

call=
cleanup() {
  exec 3>&-
  if [ -n "$call" ]; then
    kill "$call" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  # grpcurl prints a streaming call's error once its input ends: end it, and
  # give it a moment, so its status shows below.
  exec 3>&-
  if [ -n "$call" ]; then
    n=0
    while kill -0 "$call" 2>/dev/null && [ "$n" -lt 20 ]; do
      sleep 0.1
      n=$((n + 1))
    done
  fi
  if [ -s "$work/last" ]; then
    echo "--- the sidecar's last answer:" >&2
    cat "$work/last" >&2
  fi
  if [ -s "$work/out" ]; then
    echo "--- the Consume call's responses:" >&2
    cat "$work/out" >&2
  fi
  if [ -s "$work/err" ]; then
    echo "--- grpcurl's errors:" >&2
    cat "$work/err" >&2
  fi
  exit 1
}

# Runs the command "$@" until it succeeds, at most $timeout seconds.
eventually() {
  what=$1
  shift
  deadline=$(($(date +%s) + timeout))
  until "$@"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      fail "$what (after ${timeout}s)"
    fi
    sleep 0.2
  done
}

# Runs one unary call, its output (answer or error) in $work/last.
call_once() {
  grpc -max-time 10 "$@" >"$work/last" 2>&1
}

serving() {
  call_once -d '{"service":"echomq.v1.ConsumerService"}' "$target" grpc.health.v1.Health/Check \
    && grep -q '"status": "SERVING"' "$work/last"
}
eventually "the sidecar never reported SERVING" serving
echo "ok: the sidecar is SERVING"
rm -f "$work/last"

# Health and reflection need no token; this call does, and names the stream.
if ! call_once -d "{\"stream\":\"$stream\",\"group\":\"$group\"}" "$target" \
  echomq.v1.AdminService/DescribeGroup && ! grep -q 'Code: NotFound' "$work/last"; then
  fail "the sidecar refuses this client for stream $stream (DescribeGroup)"
fi
rm -f "$work/last"
echo "ok: the sidecar accepts this client for stream $stream"

mkfifo "$work/in"
# In a subshell that grpc_run=exec turns into grpcurl: $! is grpcurl's pid.
(
  grpc_run='exec'
  grpc -d @ "$target" echomq.v1.ConsumerService/Consume
) <"$work/in" >"$work/out" 2>"$work/err" &
call=$!
exec 3>"$work/in"
printf '{"subscribe":{"stream":"%s","group":"%s","groupStart":"GROUP_START_NEW"}}\n' "$stream" "$group" >&3

# Subscribed; a call the sidecar refused (a wrong token, a stream outside the
# allow-list) or that could not connect fails at once with grpcurl's errors,
# which carry the status.
subscribed() {
  grep -q '"subscribed": {' "$work/out" && return 0
  if grep -q '^ERROR\|^Failed' "$work/err" || ! kill -0 "$call" 2>/dev/null; then
    fail "the Consume call ended before confirming the subscription"
  fi
  return 1
}
eventually "no 'subscribed' confirmation on the Consume call" subscribed
echo "ok: subscribed to $stream as group $group"

nonce="chart test $(date +%s) $$"
body=$(printf '%s' "$nonce" | base64 | tr -d '\n')
cap=
[ "$max_len" = 0 ] || cap=",\"maxLen\":\"$max_len\""
call_once -d "{\"stream\":\"$stream\",\"fields\":{\"body\":\"$body\"}$cap}" \
  "$target" echomq.v1.StreamService/Append || fail "Append to $stream failed"
id=$(sed -n 's/^  "id": "\([0-9a-f]\{28\}\)".*/\1/p' "$work/last")
[ -n "$id" ] || fail "Append returned no 28-hex branded id"
rm -f "$work/last"
echo "ok: appended $id"

eventually "entry $id was not delivered on the Consume call" grep -q "^    \"id\": \"$id\"" "$work/out"
grep -q "\"body\": \"$body\"" "$work/out" || fail "the delivery of $id does not carry the appended payload"
echo "ok: $id delivered with its payload"

# Ack every delivered id: ours, and any an earlier failed run left pending.
ids=$(sed -n 's/^    "id": "\([0-9a-f]\{28\}\)".*/"\1"/p' "$work/out" | sort -u | tr '\n' ',' | sed 's/,$//')
printf '{"ack":{"ids":[%s]}}\n' "$ids" >&3

nothing_pending() {
  call_once -emit-defaults -d "{\"stream\":\"$stream\",\"group\":\"$group\"}" "$target" \
    echomq.v1.AdminService/DescribeGroup && grep -q '^  "pending": "0"' "$work/last"
}
eventually "the group still has pending entries after the ack" nothing_pending
if grep -q '"verdictError"' "$work/out"; then
  fail "the ack got a verdict error"
fi
echo "ok: acked; nothing pending in group $group"

# Half-close: the sidecar ends the call, grpcurl exits 0.
exec 3>&-
wait "$call" || fail "the Consume call did not end cleanly"
call=
echo "ok: round trip complete"

#!/bin/sh
# Chart test: an append-then-consume round trip through the sidecar.
#
#   1. waits until grpc.health.v1 says SERVING;
#   2. opens a Consume call and subscribes to $ECHOMQ_TEST_STREAM through the
#      group $ECHOMQ_TEST_GROUP (new entries only), waits for `subscribed`;
#   3. appends one entry (StreamService/Append) and keeps its branded id;
#   4. waits for the delivery of that id, checks its payload,
#      and acks it (and any leftover delivery of an earlier, failed run);
#   5. closes the call and waits until DescribeGroup reports nothing pending.
#
# Input: ECHOMQ_SIDECAR_ADDRESS (`host:port` or `unix:/path`, default
# 127.0.0.1:50051), ECHOMQ_TEST_STREAM, ECHOMQ_TEST_GROUP, ECHOMQ_TEST_TIMEOUT
# (seconds per step, default 60). Needs a POSIX shell, grpcurl, base64, mkfifo.
set -eu

addr=${ECHOMQ_SIDECAR_ADDRESS:-127.0.0.1:50051}
stream=${ECHOMQ_TEST_STREAM:-echomq-chart-test}
group=${ECHOMQ_TEST_GROUP:-echomq-chart-test}
timeout=${ECHOMQ_TEST_TIMEOUT:-60}
work=$(mktemp -d "${TMPDIR:-/tmp}/echomq-roundtrip.XXXXXX")
case $addr in
  unix:*) unix=-unix target=${addr#unix:} ;;
  *) unix='' target=$addr ;;
esac

call=
cleanup() {
  exec 3>&-
  if [ -n "$call" ]; then
    kill "$call" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

grpc() {
  grpcurl -plaintext $unix -max-time 10 "$@"
}

fail() {
  echo "FAIL: $*" >&2
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

serving() {
  grpc -d '{"service":"echomq.v1.ConsumerService"}' "$target" grpc.health.v1.Health/Check 2>/dev/null \
    | grep -q '"status": "SERVING"'
}
eventually "the sidecar never reported SERVING" serving
echo "ok: the sidecar is SERVING"

mkfifo "$work/in"
grpcurl -plaintext $unix -d @ "$target" echomq.v1.ConsumerService/Consume <"$work/in" >"$work/out" 2>"$work/err" &
call=$!
exec 3>"$work/in"
printf '{"subscribe":{"stream":"%s","group":"%s","groupStart":"GROUP_START_NEW"}}\n' "$stream" "$group" >&3
eventually "no 'subscribed' confirmation on the Consume call" grep -q '"subscribed": {' "$work/out"
echo "ok: subscribed to $stream as group $group"

nonce="chart test $(date +%s) $$"
body=$(printf '%s' "$nonce" | base64 | tr -d '\n')
appended=$(grpc -d "{\"stream\":\"$stream\",\"fields\":{\"body\":\"$body\"},\"maxLen\":\"100\"}" \
  "$target" echomq.v1.StreamService/Append) || fail "Append failed: $appended"
id=$(printf '%s\n' "$appended" | sed -n 's/^  "id": "\([0-9a-f]\{28\}\)".*/\1/p')
[ -n "$id" ] || fail "Append returned no 28-hex branded id: $appended"
echo "ok: appended $id"

eventually "entry $id was not delivered on the Consume call" grep -q "^    \"id\": \"$id\"" "$work/out"
grep -q "\"body\": \"$body\"" "$work/out" || fail "the delivery of $id does not carry the appended payload"
echo "ok: $id delivered with its payload"

# Ack every delivered id: ours, and any an earlier failed run left pending.
ids=$(sed -n 's/^    "id": "\([0-9a-f]\{28\}\)".*/"\1"/p' "$work/out" | sort -u | tr '\n' ',' | sed 's/,$//')
printf '{"ack":{"ids":[%s]}}\n' "$ids" >&3

nothing_pending() {
  grpc -emit-defaults -d "{\"stream\":\"$stream\",\"group\":\"$group\"}" "$target" \
    echomq.v1.AdminService/DescribeGroup 2>/dev/null | grep -q '^  "pending": "0"'
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

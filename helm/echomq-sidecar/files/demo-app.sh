#!/bin/sh
# The example Deployment's demo app: a small consumer in shell around grpcurl,
# to show the sidecar at work (`kubectl logs <pod> -c app`). Replace it with
# your service, which would use a client library instead.
#
# Every $ECHOMQ_DEMO_PRODUCE_INTERVAL seconds (0: never) it appends an entry to
# $ECHOMQ_DEMO_STREAM; it subscribes to that stream through the group
# $ECHOMQ_DEMO_GROUP (new entries only) and acks every delivery it receives.
# When the call ends (the sidecar drains or restarts) it subscribes again after
# two seconds. On SIGTERM it stops its children and exits 0.
#
# It dials $ECHOMQ_SIDECAR_ADDRESS with the token and TLS settings of the
# ECHOMQ_CLIENT_* variables (see grpc-client.sh, next to this script in the pod;
# files/tests/grpc-client.sh in the chart). Needs a POSIX shell (busybox is
# enough), grpcurl, base64 and mkfifo.
set -u

stream=${ECHOMQ_DEMO_STREAM:-echomq-demo}
group=${ECHOMQ_DEMO_GROUP:-echomq-demo}
interval=${ECHOMQ_DEMO_PRODUCE_INTERVAL:-5}
# The Append's max_len; 0 appends without one (a sidecar with an archive refuses it).
max_len=${ECHOMQ_APPEND_MAX_LEN:-10000}
cap=
[ "$max_len" = 0 ] || cap=",\"maxLen\":\"$max_len\""
work=$(mktemp -d "${TMPDIR:-/tmp}/echomq-demo.XXXXXX")

here=$(dirname "$0")
if [ -f "$here/grpc-client.sh" ]; then
  # shellcheck source=tests/grpc-client.sh
  . "$here/grpc-client.sh"
else
  # shellcheck source=tests/grpc-client.sh
  . "$here/tests/grpc-client.sh"
fi

say() {
  echo "demo-app: $*"
}
say "calling $(grpc_describe)"

pids=
stop() {
  say "stopping"
  # shellcheck disable=SC2086 # a list of pids
  kill $pids 2>/dev/null
  rm -rf "$work"
  exit 0
}
trap stop TERM INT

produce() {
  n=0
  while :; do
    n=$((n + 1))
    body=$(printf 'demo entry %s from %s' "$n" "$(hostname)" | base64 | tr -d '\n')
    if out=$(grpc -max-time 10 \
      -d "{\"stream\":\"$stream\",\"fields\":{\"body\":\"$body\"}$cap}" \
      "$target" echomq.v1.StreamService/Append 2>&1); then
      say "appended $(printf '%s\n' "$out" | sed -n 's/^  "id": "\([0-9a-f]*\)".*/\1/p')"
    else
      say "append failed: $(printf '%s' "$out" | tr '\n' ' ')"
    fi
    sleep "$interval"
  done
}

# Reads the Consume call's responses (grpcurl prints each as indented JSON) and
# acks each delivery through fd 3, the call's request side.
react() {
  in_delivery=
  while IFS= read -r line; do
    case $line in
      '  "subscribed": {') say "subscribed to $stream as group $group" ;;
      '  "delivery": {') in_delivery=1 ;;
      '  "verdictError": {') say "verdict error: $line" ;;
      '    "id": "'*)
        if [ -n "$in_delivery" ]; then
          id=$(printf '%s\n' "$line" | sed 's/.*"id": "\([0-9a-f]*\)".*/\1/')
          printf '{"ack":{"ids":["%s"]}}\n' "$id" >&3
          say "delivered and acked $id"
          in_delivery=
        fi
        ;;
    esac
  done
}

if [ "$interval" -gt 0 ]; then
  produce &
  pids="$pids $!"
fi

# A streaming call shows its error only once its input ends; this unary call
# first shows a refusal (a wrong token, a stream off the allow-list, TLS)
# in the log, with its status. NotFound (no group yet) is fine.
admitted() {
  if out=$(grpc -max-time 10 -d "{\"stream\":\"$stream\",\"group\":\"$group\"}" \
    "$target" echomq.v1.AdminService/DescribeGroup 2>&1) || printf '%s\n' "$out" | grep -q 'Code: NotFound'; then
    return 0
  fi
  say "the sidecar does not take this app's calls on $stream yet: $(printf '%s' "$out" | tr '\n' ' ')"
  return 1
}

producer_pids=$pids
while :; do
  if ! admitted; then
    sleep 5
    continue
  fi
  rm -f "$work/in" "$work/out"
  mkfifo "$work/in" "$work/out"
  # grpc_run=exec: the subshell becomes grpcurl, so $! is the call's pid. Its
  # errors (e.g. `Code: Unauthenticated`) go to the container's log.
  (
    grpc_run='exec'
    grpc -d @ "$target" echomq.v1.ConsumerService/Consume
  ) <"$work/in" >"$work/out" &
  call=$!
  exec 3>"$work/in"
  printf '{"subscribe":{"stream":"%s","group":"%s","groupStart":"GROUP_START_NEW"}}\n' "$stream" "$group" >&3
  react <"$work/out" &
  reader=$!
  pids="$producer_pids $call $reader"
  wait "$call"
  say "the Consume call ended (status $?); subscribing again in 2 s"
  exec 3>&-
  wait "$reader"
  pids=$producer_pids
  sleep 2
done

#!/bin/sh
# Chart test: the example pods' admin port answers through the admin Service:
# GET /livez and GET /readyz return 200 (ready means Redis answers PING), and
# GET /metrics serves the Prometheus exposition.
#
# Input: ECHOMQ_ADMIN_URL (e.g. http://release-echomq-sidecar-admin:9464),
# ECHOMQ_TEST_TIMEOUT (seconds, default 60). Needs a POSIX shell and wget
# (busybox is enough).
set -eu

url=${ECHOMQ_ADMIN_URL:?set ECHOMQ_ADMIN_URL to the admin Service URL}
timeout=${ECHOMQ_TEST_TIMEOUT:-60}
deadline=$(($(date +%s) + timeout))

# Fetches a path; wget exits non-zero on any status other than 2xx. (No -T:
# some busybox builds crash on it; timeout bounds the request instead.)
fetch() {
  timeout 5 wget -q -O - "$url$1"
}

for path in /livez /readyz; do
  until fetch "$path" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "FAIL: GET $url$path did not answer 200 within ${timeout}s" >&2
      fetch "$path" >&2 || true
      exit 1
    fi
    sleep 1
  done
  echo "ok: GET $path answers 200"
done

metrics=$(fetch /metrics)
if ! printf '%s\n' "$metrics" | grep -q '^# EOF'; then
  echo "FAIL: GET /metrics is not an OpenMetrics exposition (no '# EOF' line)" >&2
  exit 1
fi
echo "ok: GET /metrics serves $(printf '%s\n' "$metrics" | grep -c '^# TYPE') metric families"

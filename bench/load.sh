#!/usr/bin/env bash
# Load benchmark: 50 concurrent clients against each main page of a real `berth serve`:
# the catalog, "My environments" (with ten environments in the list), the availability
# calendar, one environment's page and the fleet chart, signed in as the administrator.
# Prints wrk's latency distribution for each.
#
#   bench/load.sh [seconds]   the measurement of BENCHMARKS.md (make bench; 30 s per page)
#   BENCH_PAGES="calendar fleet" bench/load.sh 15   only those pages
#   bench/load.sh --smoke     two seconds a page with 4 clients, to prove the script still
#                             works (make bench-smoke, part of make test); curl stands in
#                             for wrk where wrk is missing. Figures from it mean nothing.
#
# Fails when sign-in or a launch breaks, when a page does not answer 200 with its content
# (an error box or the sign-in prompt instead), or when wrk saw an answer other than 2xx/3xx.
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=false
if [ "${1:-}" = --smoke ]; then
  smoke=true
  seconds=2 connections=4
else
  seconds=${1:-30} connections=50
fi
berth=${BERTH_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/berth/target}/release/berth}
if ! command -v wrk >/dev/null && ! $smoke; then
  echo "wrk is missing: apt-get install wrk" >&2
  exit 1
fi
command -v python3 >/dev/null || { echo "python3 is missing (it computes the one-time code)" >&2; exit 1; }

dir=$(mktemp -d)
trap 'kill ${pid:-} 2>/dev/null; rm -rf "$dir"' EXIT
# Ports below Linux's ephemeral range (32768 and up): a fixed port there can be a client
# connection's own port for a moment, and the listen fails. One taken all the same is
# passed over for the next.
for port in ${BENCH_PORT:-$(seq 29170 29179)}; do
  url=http://127.0.0.1:$port
  BERTH_LOG=warn "$berth" serve --listen 127.0.0.1:$port --database "sqlite://$dir/berth-$port.db" \
    --site-root target/site --demo --sim-speed 0 >"$dir/berth.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    curl -fs "$url/readyz" >/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  # Ours answering, not something else already on the port.
  kill -0 $pid 2>/dev/null && curl -fs "$url/readyz" >/dev/null && break
  grep -q "Address already in use" "$dir/berth.log" || break
done
kill -0 $pid 2>/dev/null && curl -fs "$url/readyz" >/dev/null || {
  echo "berth did not start on port $port:" >&2
  cat "$dir/berth.log" >&2
  exit 1
}

# A POST to a server function with the session in the cookie jar. Origin on every POST: a
# browser sends it, and Berth may refuse cookie-authenticated writes without it.
post() {
  local path=$1
  shift
  curl -fsS -b "$dir/jar" -c "$dir/jar" -H "Origin: $url" -H 'Accept: application/json' "$@" "$url$path"
}

# The RFC 6238 code (HMAC-SHA1, 30 s steps, 6 digits) of a base32 secret, as an
# authenticator app shows it.
totp() {
  python3 -c '
import base64, hashlib, hmac, struct, sys, time
secret = sys.argv[1].strip().upper()
key = base64.b32decode(secret + "=" * (-len(secret) % 8))
digest = hmac.new(key, struct.pack(">Q", int(time.time()) // 30), hashlib.sha1).digest()
offset = digest[19] & 15
print("%06d" % ((struct.unpack(">I", digest[offset:offset + 4])[0] & 0x7FFFFFFF) % 1000000))
' "$1"
}

# Signs in as the first-start administrator, every step a browser goes through, and leaves
# the session cookie in the jar. Every sign-in step lives here, so a new one is added once.
sign_in() {
  local password secret
  password=$(sed -n 's/.*One-time password: \(\S*\).*/\1/p' "$dir/berth.log")
  [ -n "$password" ] || { echo "no one-time password in berth's log" >&2; exit 1; }
  post /api/sign_in -o /dev/null --data-urlencode email=admin@berth.local --data-urlencode "password=$password"
  # The printed password only lets its holder choose their own.
  password="load bench $RANDOM$RANDOM"
  post /api/choose_password -o /dev/null --data-urlencode "password=$password" --data-urlencode "again=$password"
  # A platform admin's second factor: the authenticator's secret is given at the first
  # sign-in, then the code from it.
  secret=$(post /api/second_factor -d '' |
    python3 -c 'import json, sys; print(json.load(sys.stdin).get("secret") or "")')
  [ -n "$secret" ] || { echo "no authenticator secret at the administrator's first sign-in" >&2; exit 1; }
  post /api/verify_code -o /dev/null --data-urlencode "code=$(totp "$secret")"
}

sign_in
cookie=$(awk '$6 == "berth_session" { print $7 }' "$dir/jar")
[ -n "$cookie" ] || { echo "no session cookie after sign-in" >&2; exit 1; }
# Ten environments of the administrator's own, so the list has rows to render. The launch
# answers the new environment's id (a JSON string); the first one's page is measured.
for i in $(seq 10); do
  id=$(post /api/launch \
    --data-urlencode 'request[offering]=notebook' --data-urlencode 'request[size]=h100-1g.10gb' \
    --data-urlencode "request[name]=bench-$i" --data-urlencode 'request[hours]=4' |
    python3 -c 'import json, sys; print(json.load(sys.stdin))')
  [ "$i" = 1 ] && first=$id
done
[ -n "${first:-}" ] || { echo "the first launch answered no environment id" >&2; exit 1; }

rows=$(curl -fs -H "Cookie: berth_session=$cookie" "$url/environments" | grep -o 'bench-[0-9]*' | sort -u | wc -l)
[ "$rows" = 10 ] || { echo "the signed-in list shows $rows of 10 environments; not benchmarking" >&2; exit 1; }

# Each page must answer 200 with what it shows when it works, before it is measured: wrk
# would count a redirect to the sign-in page, or a page with an error box, as a success.
check_page() {
  local path=$1 expect=$2 page
  page=$(curl -fsS -H "Cookie: berth_session=$cookie" "$url$path") || {
    echo "GET $path did not answer 200" >&2
    exit 1
  }
  if grep -q 'role="alert"' <<<"$page" || grep -q 'Sign in to continue' <<<"$page"; then
    echo "GET $path shows an error or the sign-in prompt instead of the page" >&2
    exit 1
  fi
  grep -qF -- "$expect" <<<"$page" || {
    echo "GET $path does not show '$expect'" >&2
    exit 1
  }
}
check_page /catalog 'Service catalog'
check_page /environments 'bench-10'
check_page /calendar 'aria-label="Free capacity per size over time"'
check_page "/environments/$first" '>bench-1</h1>'
check_page /admin/fleet 'Page 1 of'

# wrk counts 3xx as success; a signed-out /environments would redirect, which the row check
# above rules out for this cookie.
measure() {
  local out
  if command -v wrk >/dev/null; then
    out=$(wrk -t2 -c"$connections" -d"${seconds}s" --latency "$@")
    echo "$out"
    if grep -q 'Non-2xx or 3xx responses' <<<"$out"; then
      echo "wrk saw failed answers" >&2
      exit 1
    fi
  else
    # Smoke mode without wrk: a handful of sequential requests, each must answer 200.
    for _ in $(seq 20); do
      curl -fsS -o /dev/null "$@"
    done
    echo "20 requests answered 200 (curl; install wrk for figures)"
  fi
}

# BENCH_PAGES picks some of them (e.g. "calendar fleet"), for comparing builds page by page.
pages=${BENCH_PAGES:-catalog environments calendar environment fleet}
for page in $pages; do
  case $page in
    # The catalog as anyone sees it, signed out.
    catalog) title="/catalog" path=/catalog ;;
    environments) title="/environments (signed in, 10 environments)" path=/environments ;;
    calendar) title="/calendar (week, signed in)" path=/calendar ;;
    environment) title="/environments/<id> (one of the ten)" path="/environments/$first" ;;
    fleet) title="/admin/fleet (the administrator)" path=/admin/fleet ;;
    *) echo "unknown page in BENCH_PAGES: $page (catalog, environments, calendar, environment, fleet)" >&2; exit 1 ;;
  esac
  echo "== GET $title, $connections connections, ${seconds}s"
  if [ "$page" = catalog ]; then
    measure "$url$path"
  else
    measure -H "Cookie: berth_session=$cookie" "$url$path"
  fi
  echo
done

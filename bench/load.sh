#!/usr/bin/env bash
# Load benchmark: 50 concurrent clients against the catalog page and "My environments"
# (signed in, with environments in the list) on a real `berth serve`. Prints wrk's
# latency distribution for each. Usage: bench/load.sh [seconds]   (make bench)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
berth=${BERTH_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/berth/target}/release/berth}
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }

dir=$(mktemp -d)
port=39170
url=http://127.0.0.1:$port
BERTH_LOG=warn "$berth" serve --listen 127.0.0.1:$port --database "sqlite://$dir/berth.db" \
  --site-root target/site --demo --sim-speed 0 >"$dir/berth.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do curl -fs "$url/readyz" >/dev/null && break; sleep 0.1; done

password=$(sed -n 's/.*One-time password: \(\S*\).*/\1/p' "$dir/berth.log")
curl -fs -c "$dir/jar" -o /dev/null -H 'Accept: application/json' \
  --data-urlencode email=admin@berth.local --data-urlencode "password=$password" "$url/api/sign_in"
cookie=$(awk '$6 == "berth_session" { print $7 }' "$dir/jar")
# Ten environments of the administrator's own, so the list has rows to render.
for i in $(seq 10); do
  curl -fs -o /dev/null -H "Cookie: berth_session=$cookie" -H 'Accept: application/json' \
    --data-urlencode 'request[offering]=notebook' --data-urlencode 'request[size]=h100-1g.10gb' \
    --data-urlencode "request[name]=bench-$i" --data-urlencode 'request[hours]=4' "$url/api/launch"
done

rows=$(curl -fs -H "Cookie: berth_session=$cookie" "$url/environments" | grep -o 'bench-[0-9]*' | sort -u | wc -l)
[ "$rows" = 10 ] || { echo "the signed-in list shows $rows of 10 environments; not benchmarking" >&2; exit 1; }

echo "== GET /catalog, 50 connections, ${seconds}s"
wrk -t2 -c50 -d"${seconds}s" --latency "$url/catalog"
echo
echo "== GET /environments (signed in, 10 environments), 50 connections, ${seconds}s"
wrk -t2 -c50 -d"${seconds}s" --latency -H "Cookie: berth_session=$cookie" "$url/environments"

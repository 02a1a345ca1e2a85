#!/usr/bin/env bash
# make bench-web: the web app in Debian's Chromium against a fresh `agentloop dev` (offline model): Send → first
# visible text and → whole reply, median and p90 over 20 sends, and the built bundle's size (gzip -9).
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
go build -o "$tmp/agentloop" ./cmd/agentloop
OPENAI_API_KEY= "$tmp/agentloop" dev --addr 127.0.0.1:0 --data "$tmp/data" >"$tmp/out" 2>/dev/null &
pid=$!
for _ in $(seq 100); do grep -q '^agentloop dev serving on ' "$tmp/out" && break; sleep 0.1; done
url=$(sed -n 's/^agentloop dev serving on //p' "$tmp/out")
node web/e2e/e2e.mjs --url "$url" --bench 20 --artifacts "$tmp/shots"
js=0; css=0
for f in web/dist/app/assets/*.js; do js=$((js + $(gzip -9c "$f" | wc -c))); done
for f in web/dist/app/assets/*.css; do css=$((css + $(gzip -9c "$f" | wc -c))); done
echo "web bundle (gzip -9): JS $((js / 1024)) KiB, CSS $((css / 1024)) KiB"

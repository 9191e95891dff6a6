#!/usr/bin/env bash
# soak.sh — start `lamina serve` and soak it under faults (scripts/soak.py): 16 clients mixing
# chat, streams, completions, embeddings, cancelled streams, slow readers, oversized and malformed
# bodies; RSS and file descriptors every 30 s; SIGTERM at the end (the server must finish the
# requests in flight and exit 0).
#
# Usage: scripts/soak.sh [SECONDS (600)] [CLIENTS (16)]
#   env: LAMINA (default target/release/lamina, built if missing), MODEL (default smollm2-135m,
#        pulled on first use), PORT (default 18090), SERVE_ARGS (extra flags, default "-np 4 -c 8192").
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_RUN="${1:-600}"
CLIENTS="${2:-16}"
LAMINA="${LAMINA:-target/release/lamina}"
MODEL="${MODEL:-smollm2-135m}"
PORT="${PORT:-18090}"
SERVE_ARGS="${SERVE_ARGS:--np 4 -c 8192}"
REPORT=30
[ "$SECONDS_RUN" -lt 120 ] && REPORT=10
if [ ! -x "$LAMINA" ]; then
    cargo build --release -p lamina-cli
fi
# shellcheck disable=SC2086
"$LAMINA" serve -m "$MODEL" --port "$PORT" $SERVE_ARGS > "${TMPDIR:-/tmp}/lamina-soak-server.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
        break
    fi
    kill -0 $PID 2>/dev/null || { cat "${TMPDIR:-/tmp}/lamina-soak-server.log"; exit 1; }
    sleep 0.5
done
echo "soak: $CLIENTS clients for $SECONDS_RUN s against $LAMINA serve -m $MODEL $SERVE_ARGS (pid $PID)"
python3 scripts/soak.py --pid "$PID" --url "http://127.0.0.1:$PORT" --clients "$CLIENTS" \
    --seconds "$SECONDS_RUN" --report "$REPORT" --drain 60

#!/usr/bin/env bash
# LocalStack S3 in host mode (no Docker): install into a venv, start, stop.
#
#   minio/localstack.sh install     # venv under $BLOBSNAP_TOOLS (default ~/.cache/blobsnap)
#   minio/localstack.sh start       # listens on 127.0.0.1:$LOCALSTACK_PORT (default 4566)
#   minio/localstack.sh stop        # stops the process started by `start` (by its PID)
#   minio/localstack.sh env         # prints the BLOBSNAP_TEST_S3_* variables for the suite
#
# Recipe (measured on this kind of machine): LocalStack 2026.x needs Python >= 3.13 (3.11 and
# 3.12 fail with a misleading "No component plugins found"); the pins below each fix a break
# in an unpinned dependency. Without GATEWAY_SERVER=hypercorn it binds 0.0.0.0 whatever
# GATEWAY_LISTEN says.
set -euo pipefail

TOOLS=${BLOBSNAP_TOOLS:-$HOME/.cache/blobsnap}
VENV=$TOOLS/localstack-venv
PORT=${LOCALSTACK_PORT:-4566}
STATE=${LOCALSTACK_STATE:-$TOOLS/localstack-state}
PIN="localstack-core[runtime]==2026.3.0"

find_python() {
  for p in "${LOCALSTACK_PYTHON:-}" python3.13 "$HOME"/.pyenv/versions/3.13*/bin/python3.13 /usr/bin/python3.13; do
    [ -n "$p" ] || continue
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 13))' 2>/dev/null; then
      command -v "$p"; return 0
    fi
  done
  return 1
}

install() {
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.blobsnap-pin" 2>/dev/null)" = "$PIN" ]; then
    return 0
  fi
  local py
  if ! py=$(find_python); then
    echo "localstack.sh: no Python >= 3.13 found (set LOCALSTACK_PYTHON); LocalStack 2026.x needs it" >&2
    exit 1
  fi
  echo "localstack.sh: installing $PIN into $VENV with $py" >&2
  rm -rf "$VENV"
  mkdir -p "$TOOLS"
  "$py" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$PIN" 'cbor2<6' 'pyopenssl<25' 'cryptography<45' service_identity
  echo "$PIN" > "$VENV/.blobsnap-pin"
}

healthy() { curl -sf "http://127.0.0.1:$PORT/_localstack/health" >/dev/null 2>&1; }

stop() {
  if [ -f "$STATE/pid" ]; then
    local pid; pid=$(cat "$STATE/pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$STATE/pid"
  fi
}

start() {
  install
  stop
  if healthy; then
    echo "localstack.sh: something already answers on 127.0.0.1:$PORT; refusing to start a second server" >&2
    exit 1
  fi
  mkdir -p "$STATE"
  # setsid: LocalStack and anything it spawns form one process group, stopped together.
  ( cd "$STATE"
    GATEWAY_LISTEN=127.0.0.1:$PORT SERVICES=s3 GATEWAY_SERVER=hypercorn DNS_ADDRESS=0 \
      EAGER_SERVICE_LOADING=1 setsid nohup "$VENV/bin/python" -m localstack.runtime.main \
      >"$STATE/localstack.log" 2>&1 </dev/null &
    echo $! >"$STATE/pid" )
  for _ in $(seq 1 300); do
    if healthy; then
      echo "localstack.sh: LocalStack S3 ready on http://127.0.0.1:$PORT (pid $(cat "$STATE/pid"))" >&2
      return 0
    fi
    if ! kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then break; fi
    sleep 0.2
  done
  echo "localstack.sh: LocalStack did not become ready; last log lines:" >&2
  tail -n 40 "$STATE/localstack.log" >&2 || true
  stop
  exit 1
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  env)
    echo "BLOBSNAP_TEST_S3_ENDPOINT=http://127.0.0.1:$PORT"
    echo "BLOBSNAP_TEST_S3_ACCESS_KEY=test"
    echo "BLOBSNAP_TEST_S3_SECRET_KEY=test"
    echo "BLOBSNAP_TEST_S3_REGION=us-east-1"
    echo "BLOBSNAP_TEST_S3_EXPECT_CREATE_ONLY=atomic"
    ;;
  *) echo "usage: $0 install|start|stop|env" >&2; exit 2 ;;
esac

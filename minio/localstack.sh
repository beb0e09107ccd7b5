#!/usr/bin/env bash
# LocalStack S3 in host mode (no Docker): install into a venv, start, stop.
#
#   minio/localstack.sh install     # venv under $BLOBSNAP_TOOLS (default ~/.cache/blobsnap)
#   minio/localstack.sh start       # listens on 127.0.0.1:$LOCALSTACK_PORT (default: a free port)
#   minio/localstack.sh stop        # stops the server of this state dir (by its PID, verified)
#   minio/localstack.sh env         # prints the BLOBSNAP_TEST_S3_* variables for the suite
#
# Each instance has a state dir of its own (LOCALSTACK_STATE; default one per clone under
# $BLOBSNAP_TOOLS/instances), holding its PID, port, owner and log: two clones or two CI runs
# never stop or reuse each other's server, and `start` first stops and deletes the instances
# whose owner (the script run that started them) is gone — a run killed at its time limit.
# Python: LocalStack needs >= 3.13; a fresh machine of this kind has pyenv's 3.13 (found under
# ~/.pyenv/versions); elsewhere set LOCALSTACK_PYTHON.
#
# Recipe (measured on this kind of machine): LocalStack 2026.x needs Python >= 3.13 (3.11 and
# 3.12 fail with a misleading "No component plugins found"); the pins below each fix a break
# in an unpinned dependency. Without GATEWAY_SERVER=hypercorn it binds 0.0.0.0 whatever
# GATEWAY_LISTEN says.
set -euo pipefail

TOOLS=${BLOBSNAP_TOOLS:-$HOME/.cache/blobsnap}
source "$(dirname "$0")/common.sh"
VENV=$TOOLS/localstack-venv
CLONE=$(cd "$(dirname "$0")/.." && pwd)
STATE=${LOCALSTACK_STATE:-$TOOLS/instances/localstack-$(echo "$CLONE" | cksum | cut -d' ' -f1)}
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

install() { with_lock "$TOOLS/localstack-install.lock" install_locked; }

install_locked() {
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

port() { cat "$STATE/port" 2>/dev/null || echo "${LOCALSTACK_PORT:-4566}"; }
healthy() { curl -sf "http://127.0.0.1:$1/_localstack/health" >/dev/null 2>&1; }

stop() {
  if [ -f "$STATE/pid" ]; then
    local pid; pid=$(cat "$STATE/pid")
    if pid_is_ours "$pid" "$STATE"; then stop_pid "$pid"; fi
    rm -f "$STATE/pid"
  fi
}

stop_state() { LOCALSTACK_STATE=$1 bash "$0" stop; }

# A CA of this instance's own and a server certificate it signed for localhost/127.0.0.1, made
# once per state dir with openssl: LocalStack serves TLS with it on the same port
# (CUSTOM_SSL_CERT_PATH: key, certificate, chain in one file), and the tests of `ca-bundle`
# trust it through $STATE/tls/ca.crt. (LocalStack's own fallback certificate is self-signed,
# not a CA, and has no IP SAN.)
tls_certs() {
  local d=$STATE/tls
  [ -s "$d/server.pem" ] && [ -s "$d/ca.crt" ] && return 0
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=blobsnap test CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>"$d/openssl.log"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$d/srv.key" -out "$d/srv.csr" 2>>"$d/openssl.log"
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$d/ext"
  openssl x509 -req -in "$d/srv.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -extfile "$d/ext" -out "$d/srv.crt" 2>>"$d/openssl.log"
  cat "$d/srv.key" "$d/srv.crt" "$d/ca.crt" >"$d/server.pem"
}

start() {
  install
  stop
  reap_orphans localstack "$STATE" stop_state
  local PORT=${LOCALSTACK_PORT:-}
  if [ -z "$PORT" ]; then PORT=$(free_port_range 1); fi
  if healthy "$PORT" || ! port_free "$PORT"; then
    echo "localstack.sh: port $PORT on 127.0.0.1 is taken; refusing to start a second server" >&2
    exit 1
  fi
  mkdir -p "$STATE"
  tls_certs
  echo "$PORT" >"$STATE/port"
  write_owner "$STATE"
  register_instance localstack "$STATE"
  # setsid: LocalStack and anything it spawns form one process group, stopped together. Its
  # working directory is the state dir (how `stop` recognizes it), its files stay in it
  # (FILESYSTEM_ROOT; the default is a dir in the venv that every instance would share).
  ( cd "$STATE"
    CUSTOM_SSL_CERT_PATH=$STATE/tls/server.pem SKIP_SSL_CERT_DOWNLOAD=1 \
    DISABLE_EVENTS=1 FILESYSTEM_ROOT=$STATE/fs GATEWAY_LISTEN=127.0.0.1:$PORT SERVICES=s3 GATEWAY_SERVER=hypercorn DNS_ADDRESS=0 \
      EAGER_SERVICE_LOADING=1 setsid nohup "$VENV/bin/python" -m localstack.runtime.main \
      >"$STATE/localstack.log" 2>&1 </dev/null 8>&- 9>&- &
    echo $! >"$STATE/pid" )
  for _ in $(seq 1 300); do
    if healthy "$PORT"; then
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
    echo "BLOBSNAP_TEST_S3_ENDPOINT=http://127.0.0.1:$(port)"
    echo "BLOBSNAP_TEST_S3_ACCESS_KEY=test"
    echo "BLOBSNAP_TEST_S3_SECRET_KEY=test"
    echo "BLOBSNAP_TEST_S3_REGION=us-east-1"
    echo "BLOBSNAP_TEST_S3_EXPECT_CREATE_ONLY=atomic"
    # The same server over TLS (same port), and the CA that signed its certificate.
    echo "BLOBSNAP_TEST_S3_SERVER=localstack"
    echo "BLOBSNAP_TEST_S3_TLS_ENDPOINT=https://127.0.0.1:$(port)"
    echo "BLOBSNAP_TEST_S3_CA_BUNDLE=$STATE/tls/ca.crt"
    # Virtual-hosted addressing: LocalStack takes <bucket>.s3.<any domain> as the bucket's
    # host (.test never resolves: the tests map the name to 127.0.0.1 with s3.resolve).
    echo "BLOBSNAP_TEST_S3_VHOST_DOMAIN=s3.blobsnap.test"
    ;;
  *) echo "usage: $0 install|start|stop|env" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Garage (https://garagehq.deuxfleurs.fr), a distributed S3-compatible store, on loopback:
# one node, or an N-node cluster on this machine. No Docker.
#
#   minio/garage.sh install          # cargo install garage (once; cached under $BLOBSNAP_TOOLS)
#   minio/garage.sh start [N]        # N nodes (default 1); replication factor min(N, 3)
#   minio/garage.sh stop             # stops every node started by `start` (by PID)
#   minio/garage.sh env              # the BLOBSNAP_TEST_S3_* variables for the suites
#   minio/garage.sh kill-node I      # SIGKILL node I (1-based): a storage node lost
#   minio/garage.sh start-node I     # start node I again (same dirs, same identity)
#   minio/garage.sh repair           # `garage repair` of tables and blocks on every node
#   minio/garage.sh status           # `garage status`
#   minio/garage.sh cli I ARGS...    # `garage ARGS...` with node I's config
#
# Node I (1-based) listens on S3 port BASE + 10*(I-1), RPC +1, admin +3, all on 127.0.0.1;
# BASE is $GARAGE_BASE_PORT, or (default) a free range chosen at `start` and kept in the state
# dir. State (config, metadata, data, logs, PIDs, ports, owner) lives under $GARAGE_STATE
# (default: one per clone under $BLOBSNAP_TOOLS/instances); `start` wipes that dir, and only
# that one. A PID is signalled only while its command line names this state dir's config, and
# `start` first stops and deletes the instances of any clone whose owner (the script run that
# started them) is gone — a run killed at its time limit.
#
# RPC timeout: 10 s instead of Garage's 300 s (GARAGE_RPC_TIMEOUT_MS): a block a node learns it
# needs is fetched 2 x this timeout later, so a repaired node catches up in ~20 s, not 10 min.
#
# Durability: Garage does not fsync by default; these configs set metadata_fsync and
# data_fsync to true, so an acknowledged PUT survives a node's power loss.
# What differs from AWS (blobsnap probes it: `blobsnap probe`): If-None-Match on PUT is
# accepted but not enforced (no fence: a job needs unsafe_no_fencing), object tagging is not
# implemented, clients must use region "garage" and path-style addressing.
set -euo pipefail

TOOLS=${BLOBSNAP_TOOLS:-$HOME/.cache/blobsnap}
source "$(dirname "$0")/common.sh"
VERSION=${GARAGE_VERSION:-2.5.0}
GARAGE=${GARAGE_BIN:-$TOOLS/garage/bin/garage}
CLONE=$(cd "$(dirname "$0")/.." && pwd)
STATE=${GARAGE_STATE:-$TOOLS/instances/garage-$(echo "$CLONE" | cksum | cut -d' ' -f1)}
BASE=$(cat "$STATE/base_port" 2>/dev/null || echo "${GARAGE_BASE_PORT:-3900}")
BUCKET=${GARAGE_BUCKET:-blobsnap-test}
KEY_ID=GK0123456789abcdef01234567
SECRET=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef

install() { with_lock "$TOOLS/garage-install.lock" install_locked; }

# Only what the suites use: the sqlite metadata engine (the configs below), bundled C libs; no
# LMDB, K2V or metrics exporter, which only lengthen the build.
FEATURES=bundled-libs,sqlite
install_locked() {
  if [ -x "$GARAGE" ] && "$GARAGE" --version 2>/dev/null | grep -q "$VERSION" \
    && [ "$(cat "$TOOLS/garage/.blobsnap-features" 2>/dev/null)" = "$FEATURES" ]; then
    return 0
  fi
  echo "garage.sh: building garage $VERSION ($FEATURES) with cargo install (10-17 min on 2 cores, once)" >&2
  mkdir -p "$TOOLS/garage"
  CARGO_TARGET_DIR=${GARAGE_BUILD_DIR:-/var/tmp/garage-build} \
    cargo install garage --version "$VERSION" --locked --no-default-features \
    --features "$FEATURES" --root "$TOOLS/garage" >&2
  echo "$FEATURES" >"$TOOLS/garage/.blobsnap-features"
  "$GARAGE" --version >&2
}

s3_port() { echo $((BASE + 10 * ($1 - 1))); }
rpc_port() { echo $((BASE + 10 * ($1 - 1) + 1)); }
admin_port() { echo $((BASE + 10 * ($1 - 1) + 3)); }
nodes() { cat "$STATE/nodes" 2>/dev/null || echo 0; }
g() { "$GARAGE" -c "$STATE/node$1/garage.toml" "${@:2}"; }

write_config() {
  local i=$1 n=$2 dir=$STATE/node$1
  mkdir -p "$dir/meta" "$dir/data"
  cat >"$dir/garage.toml" <<EOF
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "sqlite"
metadata_fsync = true
data_fsync = true
replication_factor = $(( n < 3 ? n : 3 ))
rpc_bind_addr = "127.0.0.1:$(rpc_port "$i")"
rpc_public_addr = "127.0.0.1:$(rpc_port "$i")"
rpc_secret = "$(cat "$STATE/rpc_secret")"
rpc_timeout_msec = ${GARAGE_RPC_TIMEOUT_MS:-10000}

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$(s3_port "$i")"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$(admin_port "$i")"
admin_token = "blobsnap-test-admin-token"
metrics_token = "blobsnap-test-metrics-token"
EOF
}

alive() { [ -f "$STATE/node$1/pid" ] && pid_is_ours "$(cat "$STATE/node$1/pid")" "$STATE/node$1/garage.toml"; }

# How many nodes node $1 sees as connected (the HEALTHY list, hostname known).
connected() {
  g "$1" status 2>/dev/null | awk '/==== HEALTHY/{h=1; next} /====/{h=0} h && $1 ~ /^[0-9a-f]+$/ && $2 != "?"' | wc -l
}

# Wait until node $1 sees every live node connected (a restarted node rejoins in seconds, but
# RPC calls to it fail until then).
wait_connected() {
  local want=0
  for j in $(seq 1 "$(nodes)"); do if alive "$j"; then want=$((want + 1)); fi; done
  for _ in $(seq 1 600); do
    if [ "$(connected "$1")" -ge "$want" ]; then return 0; fi
    sleep 0.1
  done
  echo "garage.sh: node $1 does not see $want connected nodes:" >&2
  g "$1" status >&2 || true
  exit 1
}

start_node() {
  local i=$1 dir=$STATE/node$1
  if alive "$i"; then return 0; fi
  local restart=0
  [ -d "$dir/meta/db.sqlite" ] || [ -n "$(ls -A "$dir/meta" 2>/dev/null)" ] && restart=1
  local p
  for p in "$(s3_port "$i")" "$(rpc_port "$i")" "$(admin_port "$i")"; do
    if ! port_free "$p"; then
      echo "garage.sh: port $p on 127.0.0.1 is taken; refusing to start node $i" >&2
      exit 1
    fi
  done
  ( RUST_LOG=${GARAGE_LOG:-garage=warn} setsid nohup "$GARAGE" -c "$dir/garage.toml" server \
      >>"$dir/garage.log" 2>&1 </dev/null 8>&- 9>&- &
    echo $! >"$dir/pid" )
  local up=0
  # `node id` reads a local key file; `status` needs the node's RPC listener.
  for _ in $(seq 1 300); do
    if g "$i" status >/dev/null 2>&1; then up=1; break; fi
    if ! alive "$i"; then break; fi
    sleep 0.1
  done
  if [ "$up" != 1 ]; then
    echo "garage.sh: node $i did not start; log:" >&2
    tail -n 30 "$dir/garage.log" >&2 || true
    exit 1
  fi
  if [ "$restart" = 1 ] && [ "$(nodes)" -gt 1 ]; then
    # Rejoin at once instead of waiting for the peers' reconnect timer.
    for j in $(seq 1 "$(nodes)"); do
      if [ "$j" != "$i" ] && alive "$j"; then
        g "$i" node connect "$(g "$j" node id -q)" >/dev/null 2>&1 || true
      fi
    done
    wait_connected "$i"
    for j in $(seq 1 "$(nodes)"); do
      if [ "$j" != "$i" ] && alive "$j"; then wait_connected "$j"; fi
    done
  fi
}

kill_node() {
  local i=$1
  if alive "$i"; then
    local pid; pid=$(cat "$STATE/node$i/pid")
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$STATE/node$i/pid"
}

stop() {
  local n; n=$(nodes)
  for i in $(seq 1 "$n"); do
    if alive "$i"; then stop_pid "$(cat "$STATE/node$i/pid")"; fi
    rm -f "$STATE/node$i/pid"
  done
}

stop_state() { GARAGE_STATE=$1 bash "$0" stop; }

start() {
  local n=${1:-1}
  install
  stop
  reap_orphans garage "$STATE" stop_state
  rm -rf "$STATE"
  mkdir -p "$STATE"
  if [ -n "${GARAGE_BASE_PORT:-}" ]; then BASE=$GARAGE_BASE_PORT; else BASE=$(free_port_range $((10 * n))); fi
  echo "$BASE" >"$STATE/base_port"
  write_owner "$STATE"
  register_instance garage "$STATE"
  echo "$n" >"$STATE/nodes"
  od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$STATE/rpc_secret"
  for i in $(seq 1 "$n"); do write_config "$i" "$n"; start_node "$i"; done
  local ids=()
  for i in $(seq 1 "$n"); do ids+=("$(g "$i" node id -q)"); done
  for i in $(seq 2 "$n"); do g 1 node connect "${ids[$((i - 1))]}" >/dev/null; done
  for i in $(seq 1 "$n"); do
    g 1 layout assign -z "dc$i" -c 1G "${ids[$((i - 1))]%@*}" >/dev/null
  done
  g 1 layout apply --version 1 >/dev/null
  g 1 key import --yes -n test "$KEY_ID" "$SECRET" >/dev/null
  g 1 key allow --create-bucket test >/dev/null
  for _ in $(seq 1 100); do
    if g 1 bucket create "$BUCKET" >/dev/null 2>&1; then break; fi
    sleep 0.2
  done
  g 1 bucket allow --read --write --owner "$BUCKET" --key test >/dev/null
  echo "garage.sh: $n-node Garage ready: S3 on http://127.0.0.1:$(s3_port 1) (nodes: $(for i in $(seq 1 "$n"); do printf '%s ' "$(s3_port "$i")"; done)), bucket $BUCKET, state $STATE" >&2
}

# Full sync of the metadata tables, then a resync of the blocks they reference, on every live
# node, with resync tranquility 0 (as fast as the disks allow). Both run in the background in
# Garage; `garage.sh cli I block info HASH` tells whether a block is referenced.
repair() {
  local first=""
  for i in $(seq 1 "$(nodes)"); do
    if alive "$i"; then first=$i; break; fi
  done
  [ -n "$first" ] || { echo "garage.sh: no live node" >&2; exit 1; }
  g "$first" worker set -a resync-tranquility 0 >/dev/null
  g "$first" repair -a --yes tables >/dev/null
  sleep 1
  g "$first" repair -a --yes blocks >/dev/null
}

case "${1:-}" in
  install) install ;;
  start) start "${2:-1}" ;;
  stop) stop ;;
  kill-node) kill_node "${2:?node number}" ;;
  start-node) start_node "${2:?node number}" ;;
  repair) repair ;;
  status) g 1 status ;;
  cli) g "${2:?node number}" "${@:3}" ;;
  env)
    echo "BLOBSNAP_TEST_S3_ENDPOINT=http://127.0.0.1:$(s3_port 1)"
    echo "BLOBSNAP_TEST_S3_ACCESS_KEY=$KEY_ID"
    echo "BLOBSNAP_TEST_S3_SECRET_KEY=$SECRET"
    echo "BLOBSNAP_TEST_S3_REGION=garage"
    echo "BLOBSNAP_TEST_S3_BUCKET=$BUCKET"
    echo "BLOBSNAP_TEST_S3_CREATE_ONLY=auto"
    echo "BLOBSNAP_TEST_S3_EXPECT_CREATE_ONLY=ignored"
    echo "BLOBSNAP_TEST_S3_SERVER=garage"
    echo "BLOBSNAP_TEST_S3_TAGGING=false"
    # Virtual-hosted addressing under the root_domain of the config above.
    echo "BLOBSNAP_TEST_S3_VHOST_DOMAIN=s3.garage.localhost"
    # Garage implements SSE-C only (customer keys), not SSE-S3/SSE-KMS.
    echo "BLOBSNAP_TEST_S3_SSE=false"
    ;;
  *) echo "usage: $0 install|start [N]|stop|env|kill-node I|start-node I|repair|status|cli I ARGS" >&2; exit 2 ;;
esac

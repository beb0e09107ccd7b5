#!/usr/bin/env bash
# A real Apache Kafka broker for the tests (Samza 1.8.0's own Kafka checkpoint manager,
# samza/src/test/java/blobsnap/KafkaCheckpointSmokeTest.java): one KRaft node (broker and
# controller in one JVM, no ZooKeeper), jars from Maven Central, loopback only.
#
#   minio/kafka.sh install     # online: Maven resolves the broker's jars (samza/kafka-broker/pom.xml)
#                              # and writes their classpath under $BLOBSNAP_TOOLS (default
#                              # ~/.cache/blobsnap)/kafka; cached, later calls are no-ops
#   minio/kafka.sh start       # offline: formats a new, empty cluster in the state dir and runs
#                              # kafka.Kafka on 127.0.0.1:$KAFKA_PORT (default: a free port), its
#                              # controller on the next port
#   minio/kafka.sh stop        # stops the broker of this state dir (by its PID, verified)
#   minio/kafka.sh env         # prints BLOBSNAP_TEST_KAFKA=127.0.0.1:PORT for the tests
#
# Each instance has a state dir of its own (KAFKA_STATE; default one per clone under
# $BLOBSNAP_TOOLS/instances), holding its PID, ports, owner, config, data and log (kafka.log):
# two clones or two CI runs never stop or reuse each other's broker, and `start` first stops and
# deletes the instances whose owner (the script run that started them) is gone (minio/common.sh).
#
# Kafka 3.9 (samza/kafka-broker/pom.xml says why): KRaft on Java 17, and it still accepts the
# protocol versions of Samza's kafka-clients 2.4.1. Both listeners bind 127.0.0.1 and the broker
# advertises 127.0.0.1; `start` checks that the JVM listens on no other address (no JMX port:
# kafka.Kafka is run by java directly, not by kafka-run-class.sh).
set -euo pipefail

TOOLS=${BLOBSNAP_TOOLS:-$HOME/.cache/blobsnap}
source "$(dirname "$0")/common.sh"
CLONE=$(cd "$(dirname "$0")/.." && pwd)
STATE=${KAFKA_STATE:-$TOOLS/instances/kafka-$(echo "$CLONE" | cksum | cut -d' ' -f1)}
POM=$CLONE/samza/kafka-broker/pom.xml
CACHE=$TOOLS/kafka
# The classpath file is named after the pom's checksum: a changed pom (another Kafka version)
# is resolved anew by the next `install`.
CPFILE=$CACHE/classpath-$(cksum <"$POM" | cut -d' ' -f1).txt
HEAP=${KAFKA_HEAP:--Xmx512m}

# Every jar of the cached classpath is still in the local Maven repository.
installed() {
  [ -s "$CPFILE" ] || return 1
  local jar
  while IFS= read -r jar; do
    [ -f "$jar" ] || return 1
  done < <(tr ':' '\n' <"$CPFILE")
}

install() { with_lock "$TOOLS/kafka-install.lock" install_locked; }

install_locked() {
  installed && return 0
  echo "kafka.sh: resolving the broker's jars ($POM) with Maven into $CPFILE" >&2
  mkdir -p "$CACHE"
  local tmp=$CPFILE.tmp.$$
  local goal=(dependency:build-classpath -Dmdep.includeScope=runtime -Dmdep.outputFile="$tmp")
  # Offline first (the jars may be in the local repository already), then online.
  (cd "$(dirname "$POM")" && { mvn -B -ntp -Dstyle.color=never -q -o "${goal[@]}" >/dev/null 2>&1 \
    || mvn -B -ntp -Dstyle.color=never -q "${goal[@]}"; }) >&2
  [ -s "$tmp" ] || { echo "kafka.sh: Maven wrote no classpath" >&2; rm -f "$tmp"; exit 1; }
  mv "$tmp" "$CPFILE"
  installed || { echo "kafka.sh: a jar of $CPFILE is missing after Maven's run" >&2; exit 1; }
}

port() { cat "$STATE/port" 2>/dev/null; }

# The broker answers on 127.0.0.1:PORT (a TCP connect; python3, as nc is not on every machine).
answers() {
  python3 - "$1" <<'PY' 2>/dev/null
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
except OSError:
    sys.exit(1)
PY
}

# Every TCP socket PID listens on is bound to 127.0.0.1 (its sockets' inodes, looked up in
# /proc/net/tcp and tcp6); prints the ones that are not.
listens_on_loopback_only() {
  python3 - "$1" <<'PY'
import os, sys
pid = sys.argv[1]
inodes = set()
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        t = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if t.startswith("socket:["):
        inodes.add(t[8:-1])
bad = []
for name in ("tcp", "tcp6"):
    try:
        lines = open(f"/proc/{pid}/net/{name}").read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        f = line.split()
        local, state, inode = f[1], f[3], f[9]
        if state != "0A" or inode not in inodes:  # 0A: LISTEN
            continue
        addr, port = local.split(":")
        # 127.0.0.1 as /proc writes it: little-endian hex, and as an IPv4-mapped IPv6 address.
        if addr not in ("0100007F", "0000000000000000FFFF00000100007F"):
            bad.append(f"{name} {addr}:{int(port, 16)}")
if bad:
    print(" ".join(bad))
    sys.exit(1)
PY
}

stop() {
  if [ -f "$STATE/pid" ]; then
    local pid; pid=$(cat "$STATE/pid")
    if pid_is_ours "$pid" "$STATE"; then stop_pid "$pid"; fi
    rm -f "$STATE/pid"
  fi
}

stop_state() { KAFKA_STATE=$1 bash "$0" stop; }

start() {
  install
  stop
  reap_orphans kafka "$STATE" stop_state
  local PORT=${KAFKA_PORT:-} CPORT
  if [ -z "$PORT" ]; then PORT=$(free_port_range 2); fi
  CPORT=$((PORT + 1))
  if answers "$PORT" || ! port_free "$PORT" || ! port_free "$CPORT"; then
    echo "kafka.sh: port $PORT or $CPORT on 127.0.0.1 is taken; refusing to start a second broker" >&2
    exit 1
  fi
  mkdir -p "$STATE"
  echo "$PORT" >"$STATE/port"
  echo "$CPORT" >"$STATE/controller-port"
  write_owner "$STATE"
  register_instance kafka "$STATE"
  # A new, empty cluster at every start (the ports may differ from the last one's).
  rm -rf "$STATE/data" "$STATE/logs"
  mkdir -p "$STATE/data" "$STATE/logs"
  cat >"$STATE/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$STATE/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
auto.create.topics.enable=true
group.initial.rebalance.delay.ms=0
EOF
  # The broker's log4j (reload4j) output goes to stdout, kafka.log.
  cat >"$STATE/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
EOF
  local cp jvm
  cp=$(cat "$CPFILE")
  jvm=(java "$HEAP" -Xms64m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
       -Dlog4j.configuration="file:$STATE/log4j.properties" -Dkafka.logs.dir="$STATE/logs"
       -cp "$cp")
  # The cluster id: Kafka's Uuid format (16 random bytes, URL-safe base64, no padding), never
  # starting with "-" (Kafka's Uuid.randomUuid draws again too: StorageTool's argument parser
  # takes such an id for an option, "argument --cluster-id/-t: expected one argument").
  local cluster_id
  cluster_id=$(python3 -c '
import base64, uuid
while True:
    u = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not u.startswith("-"):
        print(u)
        break')
  echo "$cluster_id" >"$STATE/cluster-id"
  if ! (cd "$STATE" && "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster_id" \
        -c "$STATE/server.properties" >"$STATE/format.log" 2>&1 </dev/null 9>&-); then
    echo "kafka.sh: formatting the KRaft storage failed:" >&2
    tail -n 40 "$STATE/format.log" >&2 || true
    exit 1
  fi
  # setsid: the broker is a process group of its own, stopped together. Its working directory
  # is the state dir and its command line names it (how `stop` recognizes it).
  ( cd "$STATE"
    setsid nohup "${jvm[@]}" kafka.Kafka "$STATE/server.properties" \
      >"$STATE/kafka.log" 2>&1 </dev/null 8>&- 9>&- &
    echo $! >"$STATE/pid" )
  local pid; pid=$(cat "$STATE/pid")
  for _ in $(seq 1 600); do
    if grep -q 'Kafka Server started' "$STATE/kafka.log" 2>/dev/null && answers "$PORT"; then
      local bad
      if ! bad=$(listens_on_loopback_only "$pid"); then
        echo "kafka.sh: the broker listens on an address other than 127.0.0.1: $bad" >&2
        stop
        exit 1
      fi
      echo "kafka.sh: Kafka broker ready on 127.0.0.1:$PORT (controller 127.0.0.1:$CPORT, pid $pid)" >&2
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.2
  done
  echo "kafka.sh: the Kafka broker did not become ready; last log lines:" >&2
  tail -n 40 "$STATE/kafka.log" >&2 || true
  stop
  exit 1
}

case "${1:-}" in
  # What each step runs, present or installed (detected as the build detects them).
  install) bash "$CLONE/scripts/prereqs.sh" --tools java mvn cksum && install ;;
  start) bash "$CLONE/scripts/prereqs.sh" --tools java python3 setsid cksum && start ;;
  stop) stop ;;
  env)
    p=$(port) || { echo "kafka.sh: no broker was started in $STATE" >&2; exit 1; }
    echo "BLOBSNAP_TEST_KAFKA=127.0.0.1:$p"
    ;;
  *) echo "usage: $0 install|start|stop|env" >&2; exit 2 ;;
esac

# Sourced by minio/localstack.sh and minio/garage.sh: what lets two runs of the server scripts
# (two clones, two CI runs, a run killed at its time limit and the next one) share a machine.
#
# - Every server instance has a state dir of its own; its ports are chosen free at start
#   (unless fixed by the caller) and written there, and `env` reads them back.
# - A PID file is trusted only while that PID is still the server this state dir started
#   (its command line names the state dir, or its working directory is the state dir), so a
#   stop never signals a process of another run, even after PID reuse.
# - An instance records its owner (the PID and start time of the script run that asked for
#   it, BLOBSNAP_OWNER_PID); `reap_orphans` stops and deletes instances whose owner is gone.

# The start time of PID (clock ticks since boot), or nothing when it is gone (or a zombie).
# Fields after the command name, which may hold spaces: state is the 1st, start time the 20th.
proc_start() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '$1 != "Z" {print $20}' || true; }

# Is PID alive and the server of state dir DIR?
pid_is_ours() {
  local pid=$1 dir=$2
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  local cwd; cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null || true)
  [ "$cwd" = "$dir" ] && return 0
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir"
}

# SIGTERM the process group of PID (it was started with setsid), wait up to 10 s, SIGKILL.
# (A zombie counts as stopped: its parent reaps it.)
stop_pid() {
  local pid=$1
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do [ -n "$(proc_start "$pid")" ] || return 0; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do [ -n "$(proc_start "$pid")" ] || return 0; sleep 0.1; done
}

# Whether a server could listen on 127.0.0.1:PORT. SO_REUSEADDR, as servers bind (tokio,
# hypercorn): connections of a killed server left in TIME_WAIT on its port do not make the port
# "taken" for its restart (they did, for 60 s, when a node was restarted soon after a kill).
port_free() {
  python3 - "$1" <<'PY' 2>/dev/null
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PY
}

# A base port B with B..B+SPAN-1 all free on 127.0.0.1, from a random start between 20000
# and the kernel's ephemeral range (ip_local_port_range, 32768 by default): a port in that
# range can be taken by any outgoing connection between a node's kill and its restart.
free_port_range() {
  local span=$1 base ok lo slots
  lo=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  slots=$(( (lo - 20000 - span) / 10 ))
  if [ "$slots" -lt 10 ]; then slots=4000; fi
  for _ in $(seq 1 200); do
    base=$(( 20000 + (RANDOM * 32768 + RANDOM) % slots * 10 ))
    ok=1
    for p in $(seq "$base" $(( base + span - 1 ))); do
      if ! port_free "$p"; then ok=0; break; fi
    done
    if [ "$ok" = 1 ]; then echo "$base"; return 0; fi
  done
  echo "no free port range of $span on 127.0.0.1" >&2
  return 1
}

# Record the owner of instance dir DIR: the script run named by BLOBSNAP_OWNER_PID (test.sh
# exports its own PID), or the caller's parent shell.
write_owner() {
  local dir=$1 pid=${BLOBSNAP_OWNER_PID:-$PPID}
  echo "$pid $(proc_start "$pid")" >"$dir/owner"
}

# Does the owner recorded in DIR still run (same PID, same start time)?
owner_alive() {
  local dir=$1 pid start
  read -r pid start <"$dir/owner" 2>/dev/null || return 1
  [ -n "$pid" ] && [ "$(proc_start "$pid")" = "$start" ]
}

# Run a command under an exclusive lock on FILE (waits for another holder). The lock's file
# descriptor is closed for the servers the command starts (see the `9>&-` at their spawn).
with_lock() {
  local file=$1; shift
  mkdir -p "$(dirname "$file")"
  (
    flock 9
    "$@"
  ) 9>"$file"
}

# Register state dir DIR of a KIND instance in $TOOLS/instances (a symlink, unless DIR is
# already there), so that a later start of any clone finds it if its owner dies.
register_instance() {
  local kind=$1 dir=$2
  mkdir -p "$TOOLS/instances"
  case "$dir" in "$TOOLS"/instances/*) return 0 ;; esac
  ln -sfn "$dir" "$TOOLS/instances/$kind-link-$(echo "$dir" | cksum | cut -d' ' -f1)"
}

# Stop and delete every registered KIND instance but DIR whose owner is gone; STOP is the
# command that stops one (run with the state dir as its argument).
reap_orphans() {
  local kind=$1 self=$2 stop_cmd=$3 e d
  for e in "$TOOLS"/instances/"$kind"-*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    d=$e
    [ -L "$e" ] && d=$(readlink "$e")
    [ "$d" = "$self" ] && continue
    if [ -d "$d" ] && owner_alive "$d"; then continue; fi
    if [ -d "$d" ]; then
      echo "$kind: stopping and deleting the instance in $d (its owner is gone)" >&2
      $stop_cmd "$d" || true
      rm -rf "$d"
    fi
    rm -f "$e"
  done
}

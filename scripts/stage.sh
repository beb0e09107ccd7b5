# Sourced by scripts/test.sh and scripts/long-test.sh: `stage "name"` prints a timestamped
# stage header with the previous stage's duration.
stage_start=$(date +%s)
stage() {
  local now; now=$(date +%s)
  echo "==> [$(date -u +%H:%M:%S)] $* (previous stage: $((now - stage_start)) s)" >&2
  stage_start=$now
}

# `bounded SECS CMD...`: run CMD, stopped (TERM, then KILL 30 s later) if it runs past SECS, with
# a message naming it: a hang (a shutdown deadlock in a signal test) ends the stage with a
# reason instead of running CI into its limit.
bounded() {
  local secs=$1 rc=0
  shift
  timeout --kill-after=30 "$secs" "$@" || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "==> TIMED OUT after $secs s (a hang?): $*" >&2
  fi
  return "$rc"
}

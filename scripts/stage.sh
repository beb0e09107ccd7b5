# Sourced by scripts/test.sh and scripts/long-test.sh: `stage "name"` prints a timestamped
# stage header with the previous stage's duration.
stage_start=$(date +%s)
stage() {
  local now; now=$(date +%s)
  echo "==> [$(date -u +%H:%M:%S)] $* (previous stage: $((now - stage_start)) s)" >&2
  stage_start=$now
}

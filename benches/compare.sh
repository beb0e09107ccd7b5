#!/usr/bin/env bash
# blobsnap vs rclone vs restic on the same S3 servers and the same RocksDB store, one command:
#
#   benches/compare.sh [--size-mib 2048] [--servers garage:2,s3s:1,localstack:1] [--micro]
#                      [--scaling 1024,8192]
#
# (`name:reps`: timed repetitions per server, after one counted repetition through the proxy;
# `name:0` skips the comparison there. `--scaling`: blobsnap alone on the first server, the
# same ~100 MiB delta backed up on stores of each size, with full backup and restore times
# and peak RSS.)
#
# Installs rclone and restic (apt) and the servers when missing (Garage: cargo install, once;
# LocalStack: a venv, once), builds the release binary, starts Garage (one node, fsync on) and
# LocalStack, runs `cargo bench --bench compare` (see benches/compare.rs for what it measures),
# stops the servers. The markdown tables go to stdout and to benches/last-compare.md; progress
# to stderr. Needs ~8x the store size free under $BENCH_WORK (default /var/tmp), plus what
# the servers store (each repetition's objects are deleted after it).
set -euo pipefail
cd "$(dirname "$0")/.."

args=("$@")
size=2048
servers=garage:2,s3s:1,localstack:1
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --size-mib) size=${args[$((i + 1))]} ;;
    --servers) servers=${args[$((i + 1))]} ;;
    --scaling) scaling=${args[$((i + 1))]} ;;
  esac
done

names=",$(echo "$servers" | sed 's/:[0-9]*//g'),"
work=${BENCH_WORK:-/var/tmp}/blobsnap-compare
mkdir -p "$work"
need=$(( size * 8 ))
largest=$(echo "${scaling:-0}" | tr ',' '\n' | sort -n | tail -1)
if [ $(( largest * 4 )) -gt "$need" ]; then need=$(( largest * 4 )); fi
free=$(df -Pm "$work" | awk 'NR==2 {print $4}')
if [ "$free" -lt "$need" ]; then
  echo "compare.sh: $work has $free MiB free, the run needs about $need MiB" >&2
  exit 1
fi

missing=()
for tool in rclone restic openssl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "compare.sh: installing ${missing[*]}" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "${missing[@]}" >&2
  else sudo apt-get update -qq && sudo apt-get install -y -qq "${missing[@]}" >&2; fi
fi
bash scripts/prereqs.sh

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/blobsnap-target-release}
cargo build --release --locked --bin blobsnap >&2
export BLOBSNAP_BIN=$CARGO_TARGET_DIR/release/blobsnap

cleanup() {
  bash minio/garage.sh stop || true
  bash minio/localstack.sh stop || true
}
trap cleanup EXIT
case "$names" in *,garage,*) bash minio/garage.sh install; bash minio/garage.sh start 1 ;; esac
case "$names" in *,localstack,*) bash minio/localstack.sh install; bash minio/localstack.sh start ;; esac

{
  echo "# compare run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "Command: \`benches/compare.sh ${args[*]}\`; $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM,"
  echo "$(rclone version | head -1), $(restic version | cut -d' ' -f1-2), $(openssl version | cut -d' ' -f1-2)."
  echo
  cargo bench --locked --bench compare -- --work "$work" --servers "$servers" "$@"
} | tee benches/last-compare.md

#!/usr/bin/env bash
# The demo, in one command, on the embedded local store:
#
#   scripts/demo.sh                 # state under ./blobsnap-demo; run it again to resume
#   scripts/demo.sh --lines 100000  # any `blobsnap demo` option
#
# Installs the build prerequisites if missing, builds blobsnap (the first build compiles
# RocksDB: ~15 minutes on 2 cores), and runs `blobsnap demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh
exec cargo run --locked --quiet --bin blobsnap -- demo "$@"

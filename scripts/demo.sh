#!/usr/bin/env bash
# The demo, in one command, on the embedded local store:
#
#   scripts/demo.sh                 # state under ./blobsnap-demo; run it again to resume
#   scripts/demo.sh --lines 100000  # any `blobsnap demo` option
#
# Installs the build prerequisites if missing (scripts/prereqs.sh), builds blobsnap (the first
# build compiles RocksDB's C++: about 20 minutes on 2 cores; scripts/test.sh reuses that build)
# and runs `blobsnap demo`. Set CARGO_TARGET_DIR to build elsewhere than ./target.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh
if [ ! -x "${CARGO_TARGET_DIR:-target}/debug/blobsnap" ]; then
  echo "demo.sh: first build: compiling RocksDB and the AWS SDK takes about 20 minutes on 2 cores" >&2
fi
cargo build --locked --bin blobsnap
exec "${CARGO_TARGET_DIR:-target}/debug/blobsnap" demo "$@"

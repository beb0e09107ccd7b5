#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, through cargo-fuzz) of blobsnap's readers of untrusted
# bytes: the CheckpointV1/V2 reader, the snapshot-index reader, the marker, id, key and
# scope parsers, and the records of state through time — savepoints, checkpoint documents,
# start-from records, fork pins' keys (fuzz/fuzz_targets/). Each target also checks that what it accepts writes back
# to something that reads as the same value. Run by scripts/long-test.sh.
#
#   scripts/fuzz.sh [SECONDS per target]     # default $BLOBSNAP_LIBFUZZER_SECS or 600
#   scripts/fuzz.sh --install                # only install cargo-fuzz and fetch fuzz/'s crates
#
# Seeds: fuzz/corpus/<target>/ (documents the readers accept: Samza's V1/V2 checkpoints, an
# index, a marker, an id, a key, a scope), read-only; what libFuzzer learns goes to a scratch
# corpus under /var/tmp. A crash leaves its input in fuzz/artifacts/<target>/ and fails.
#
# No sanitizer (the crate denies `unsafe` outside its one FFI module, src/local/lazy/ffi.rs,
# which the fuzzed readers never reach): on the stable toolchain (RUSTC_BOOTSTRAP admits
# the instrumentation flags cargo-fuzz passes), in a target dir of its own (the build is
# release with coverage instrumentation; RocksDB's C++ build makes the first one slow).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-${BLOBSNAP_LIBFUZZER_SECS:-600}}
version=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q " $version"; then
  echo "fuzz.sh: installing cargo-fuzz $version" >&2
  cargo install --locked cargo-fuzz --version "$version"
fi
if [ "$secs" = --install ]; then
  (cd fuzz && cargo fetch)
  exit 0
fi
target_dir=${BLOBSNAP_FUZZ_TARGET_DIR:-/var/tmp/blobsnap-fuzz-target}
work=$(mktemp -d /var/tmp/blobsnap-fuzz-XXXXXX)
trap 'rm -rf "$work"' EXIT
export RUSTC_BOOTSTRAP=1
for t in checkpoint index parsers records; do
  mkdir -p "$work/$t"
  echo "fuzz.sh: $t for $secs s" >&2
  (cd fuzz && cargo fuzz run --sanitizer none --target-dir "$target_dir" "$t" "$work/$t" "corpus/$t" -- \
     -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1)
done

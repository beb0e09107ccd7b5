#!/usr/bin/env bash
# The Samza spike (issue 50, docs/samza.md): build the JNI crate (samza/spike-jni, its own
# workspace: no RocksDB, no AWS) and run the Maven module's tests (a Samza 1.8.0 job in a JVM
# of its own, killed and restarted; a CompletableFuture completed from Rust).
#
#   scripts/samza.sh            # online: Maven resolves what it needs (scripts/test.sh's install stage)
#   scripts/samza.sh --offline  # Maven and cargo offline (inside scripts/netns.sh)
#
# The cdylib goes to $CARGO_TARGET_DIR/spike-jni (default target/spike-jni).
set -euo pipefail
cd "$(dirname "$0")/.."
offline=()
cargo_offline=()
if [ "${1:-}" = --offline ]; then
  offline=(-o)
  cargo_offline=(--offline)
fi
target=${CARGO_TARGET_DIR:-$PWD/target}/spike-jni
CARGO_TARGET_DIR=$target cargo build --locked "${cargo_offline[@]}" --manifest-path samza/spike-jni/Cargo.toml
lib=$target/debug/libblobsnap_spike_jni.so
[ -f "$lib" ] || { echo "samza.sh: $lib was not built" >&2; exit 1; }
cd samza
mvn -B -ntp -Dstyle.color=never "${offline[@]}" -Dspike.jni.lib="$lib" clean test

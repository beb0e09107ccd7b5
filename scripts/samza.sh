#!/usr/bin/env bash
# The Java side (issue 50, docs/samza.md):
# - the Samza spike: build the JNI crate (samza/spike-jni, its own workspace: no RocksDB, no
#   AWS) and run the Maven module's tests (a Samza 1.8.0 job in a JVM of its own, killed and
#   restarted; a CompletableFuture completed from Rust);
# - samza-s3 (route 2): Samza's own blob-store engine on blobsnap's layout through
#   S3BlobStoreManager, against the suite's LocalStack (BLOBSNAP_TEST_S3_* in the environment;
#   without them its server tests fail), and blobsnap's own binary reading what it wrote
#   (BLOBSNAP_BIN, default $CARGO_TARGET_DIR/debug/blobsnap, built by the suite's cargo test).
#
#   scripts/samza.sh            # online: Maven resolves what it needs (scripts/test.sh's install
#                               # stage; samza-s3 runs only its server-less tests there)
#   scripts/samza.sh --offline  # Maven and cargo offline (inside scripts/netns.sh), every test
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
(cd samza && mvn -B -ntp -Dstyle.color=never "${offline[@]}" -Dspike.jni.lib="$lib" clean test)

cd samza-s3
if [ "${1:-}" = --offline ]; then
  export BLOBSNAP_BIN=${BLOBSNAP_BIN:-${CARGO_TARGET_DIR:-$PWD/../target}/debug/blobsnap}
  [ -x "$BLOBSNAP_BIN" ] || { echo "samza.sh: $BLOBSNAP_BIN is not built (cargo build first)" >&2; exit 1; }
  mvn -B -ntp -Dstyle.color=never -o clean test
else
  # Online, before any server runs: compile everything and run the tests that need no server,
  # which resolves every plugin and provider the offline run needs.
  mvn -B -ntp -Dstyle.color=never -Dtest=LayoutTest -Dsurefire.failIfNoSpecifiedTests=false clean test
fi

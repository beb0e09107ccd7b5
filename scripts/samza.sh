#!/usr/bin/env bash
# The Java side (issue 50, docs/samza.md):
# - samza/ (route 1): blobsnap's engine behind Samza's state-backend SPI through the JNI library
#   samza/native (a member of blobsnap's workspace: the same lock file, target dir and RocksDB
#   build); its tests load that library and, for JniJobTest (a real Samza job killed three
#   times), need the suite's S3 server (BLOBSNAP_TEST_S3_*; without them it fails) and
#   blobsnap's binary;
# - samza-s3/ (route 2): Samza's own blob-store engine on blobsnap's layout through
#   S3BlobStoreManager, against the same server, and blobsnap's binary reading what it wrote;
# - samza/'s KafkaCheckpointSmokeTest: Samza's own Kafka checkpoint manager (samza-kafka 1.8.0,
#   kafka-clients 2.4.1) writes and reads a CheckpointV2 on a Kafka broker, BLOBSNAP_TEST_KAFKA
#   (minio/kafka.sh start and env; without it the test fails).
# BLOBSNAP_BIN (default $CARGO_TARGET_DIR/debug/blobsnap) is built by the suite's cargo test.
#
#   scripts/samza.sh            # online, before any server and any Rust build (scripts/test.sh's
#                               # install stage): Maven resolves and compiles everything and
#                               # runs the tests that need neither, so that nothing is fetched later
#   scripts/samza.sh --offline  # Maven and cargo offline (inside scripts/netns.sh): every test
set -euo pipefail
cd "$(dirname "$0")/.."
mvn_args=(-B -ntp -Dstyle.color=never)
if [ "${1:-}" != --offline ]; then
  # samza-s3 first: samza/'s tests use it (installed into the local repository).
  (cd samza-s3 && mvn "${mvn_args[@]}" -Dtest=LayoutTest -Dsurefire.failIfNoSpecifiedTests=false clean install)
  (cd samza && mvn "${mvn_args[@]}" -Dtest=SamzaJobTest -Dsurefire.failIfNoSpecifiedTests=false clean test)
  exit 0
fi

target=${CARGO_TARGET_DIR:-$PWD/target}
export BLOBSNAP_BIN=${BLOBSNAP_BIN:-$target/debug/blobsnap}
[ -x "$BLOBSNAP_BIN" ] || { echo "samza.sh: $BLOBSNAP_BIN is not built (cargo build first)" >&2; exit 1; }
cargo build --locked --offline -p blobsnap-samza-jni
lib=$target/debug/libblobsnap_samza_jni.so
[ -f "$lib" ] || { echo "samza.sh: $lib was not built" >&2; exit 1; }
(cd samza-s3 && mvn "${mvn_args[@]}" -o clean install)
(cd samza && mvn "${mvn_args[@]}" -o -Dnative.lib="$lib" -Dblobsnap.bin="$BLOBSNAP_BIN" clean test)

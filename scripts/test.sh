#!/usr/bin/env bash
# The whole test suite, in one command, on a fresh machine of this kind:
#
#   scripts/test.sh
#
# 1. installs what the build and the suites need, the only steps that use the network (the
#    package registries): libclang-dev for RocksDB's bindgen (found by the names bindgen
#    loads: scripts/prereqs.sh), the tools the suites run (ldb from rocksdb-tools, curl,
#    python3, ...), LocalStack (once, into ~/.cache/blobsnap, a venv), Garage (once: cargo
#    install, ~12.5 min, cached in ~/.cache/blobsnap/garage), the crates (cargo fetch), Java 17,
#    Maven and Samza 1.8.0's jars (one online Maven run of each Java module's tests that need
#    no server and no Rust build: scripts/samza.sh), and a Kafka broker's jars (minio/kafka.sh
#    install: Kafka 3.9 from Maven Central, its classpath cached in ~/.cache/blobsnap/kafka);
# 2. runs everything else in a network namespace whose only interface is loopback
#    (scripts/netns.sh, offline cargo): no test, server or library can reach an address off
#    this machine. Inside it:
# 3. starts LocalStack on a free loopback port;
# 4. runs fmt, clippy (-D warnings; the whole crate with its tests and benches, then the
#    library alone without default features) and `cargo test` — the unit tests and every
#    module of the `it` binary (formats, conformance, backup, restore, lifecycle, cli, ...)
#    against the local store and an in-process s3s-fs server, plus the `secrets` binary — and
#    the library example (examples/embed.rs, three runs checked by their output), and the
#    Java tests with Maven offline (scripts/samza.sh --offline: route 1 through the JNI
#    library samza/native, and samza-s3, on LocalStack; Samza's own Kafka checkpoint manager
#    writes and reads a CheckpointV2 on a Kafka broker, KRaft on loopback, started for that
#    stage: minio/kafka.sh);
# 5. runs every `external::` case of the test binaries (conformance, backup, restore,
#    lifecycle, admin, faults, ...) against LocalStack;
# 6. the same external suites against a single Garage node, then the node-loss test on a
#    3-node Garage cluster (tests/garage_cluster.rs);
# 7. the interoperability test with RocksDB 7.8 (ldb), the bounded-resources test, rustdoc;
# 8. stops LocalStack, Kafka and Garage (by their PIDs) and exits non-zero if anything failed.
#
# The servers of one run are its own: state dirs named after this run's PID under
# ~/.cache/blobsnap/instances, free ports, stopped on every exit (a signal included); a run
# killed with SIGKILL leaves them behind, and the next run's server scripts stop and delete
# them (their owner is gone). Two runs with one CARGO_TARGET_DIR share its binaries: .ci/run
# holds a lock on it, so a second CI run waits for the first.
#
# Each stage prints its duration and is bounded (`bounded` in scripts/stage.sh: a hang ends its
# stage with a message naming it). Set CARGO_TARGET_DIR to reuse a build directory.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/stage.sh

if [ "${1:-}" != --suites ]; then
  stage "build prerequisites"
  bash scripts/prereqs.sh
  bash scripts/prereqs.sh --tools curl python3 flock setsid cksum ldb openssl ip unshare

  stage "LocalStack: install (cached after the first run)"
  bash minio/localstack.sh install

  stage "Garage: install (cached after the first build)"
  bash minio/garage.sh install

  stage "cargo fetch"
  cargo fetch --locked

  # Issue 50 (docs/samza.md): Samza 1.8.0's jars, the AWS SDK and Maven's plugins. `go-offline`
  # misses what surefire resolves lazily (its JUnit provider), so the online step runs the
  # very goals the offline one runs: the real build and tests (samza-s3's that need no
  # server), once, before the namespace.
  stage "Java (samza/ and samza-s3/): Maven's first run, online (the last step that uses the network)"
  bash scripts/prereqs.sh --tools java javac mvn
  bash scripts/samza.sh

  stage "Kafka broker: install (Kafka 3.9's jars from Maven Central; cached after the first run)"
  bash minio/kafka.sh install

  # No run of the suites without the guard, in CI or not (issue 46 item 14).
  export BLOBSNAP_REQUIRE_NETNS=1
  export CARGO_NET_OFFLINE=true
  exec bash scripts/netns.sh bash scripts/test.sh --suites
fi

# A backstop behind the namespace: the AWS SDK never looks for instance metadata.
export AWS_EC2_METADATA_DISABLED=true

stage "the namespace: loopback only (the interfaces, checked by a test)"
bounded 2400 cargo test --locked --test it -- --ignored --exact loopback_only::the_namespace_has_only_loopback

TOOLS=${BLOBSNAP_TOOLS:-$HOME/.cache/blobsnap}
export BLOBSNAP_OWNER_PID=$$
export LOCALSTACK_STATE=$TOOLS/instances/localstack-run-$$
export GARAGE_STATE=$TOOLS/instances/garage-run-$$
export KAFKA_STATE=$TOOLS/instances/kafka-run-$$
unset LOCALSTACK_PORT GARAGE_BASE_PORT KAFKA_PORT
cleanup() {
  bash minio/localstack.sh stop || true
  bash minio/kafka.sh stop || true
  bash minio/garage.sh stop || true
  rm -rf "$LOCALSTACK_STATE" "$GARAGE_STATE" "$KAFKA_STATE"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

stage "LocalStack: start (network namespace: ${BLOBSNAP_NETNS:-none})"
bash minio/localstack.sh start
eval "export $(bash minio/localstack.sh env | tr '\n' ' ')"

stage "cargo fmt --check"
cargo fmt --all -- --check

stage "cargo clippy"
bounded 2400 cargo clippy --locked --all-targets -- -D warnings
# The library alone, as an embedding application builds it (no clap, indicatif, exporter or
# log subscriber).
bounded 900 cargo clippy --locked --lib --no-default-features -- -D warnings
# The Samza plug-in's JNI library (samza/native, a workspace member).
bounded 900 cargo clippy --locked -p blobsnap-samza-jni --all-targets -- -D warnings

stage "cargo test (unit, formats, conformance on local + in-process s3s-fs)"
bounded 2400 cargo test --locked

stage "Java: route 1 (blobsnap's engine through JNI: a real Samza job killed three times, hostile input) and samza-s3 (Samza's engine on blobsnap's layout), on LocalStack; blobsnap reads both; Samza's Kafka checkpoint manager on a Kafka broker; Maven offline"
bounded 300 cargo test --locked -p blobsnap-samza-jni --lib
# A Kafka broker for KafkaCheckpointSmokeTest (BLOBSNAP_TEST_KAFKA), up for this stage only: a
# KRaft node on loopback, a JVM of its own (~330 MB), idle through the Rust stages otherwise.
bash minio/kafka.sh start
(
  eval "export $(bash minio/kafka.sh env | tr '\n' ' ')"
  bounded 900 bash scripts/samza.sh --offline
)
bash minio/kafka.sh stop

stage "the library example (examples/embed.rs): commits, resumes, restores a lost state dir"
embed=$(mktemp -d)
cargo run --locked --quiet --example embed -- "$embed" 1200 > /dev/null
out=$(cargo run --locked --quiet --example embed -- "$embed" 2100)
grep -q '^resuming from offset 1200$' <<< "$out" \
  || { echo "embed: the second run did not resume from the committed offset 1200: $out" >&2; exit 1; }
rm -rf "$embed/state"
out=$(cargo run --locked --quiet --example embed -- "$embed" 2100)
grep -q '^resuming from offset 2100$' <<< "$out" && grep -q '^done at offset 2100: 4200 words counted$' <<< "$out" \
  || { echo "embed: after losing its state dir the task did not restore to offset 2100 with 4200 words: $out" >&2; exit 1; }
rm -rf "$embed"

stage "external-endpoint suites (every external:: case of the test binaries) on LocalStack ($BLOBSNAP_TEST_S3_ENDPOINT)"
bounded 1200 cargo test --locked --tests -- --ignored external::

stage "external-endpoint suites on a single Garage node"
bash minio/garage.sh start 1
(
  # LocalStack's variables that Garage's env does not replace (its TLS port) must not leak in.
  unset BLOBSNAP_TEST_S3_TLS_ENDPOINT BLOBSNAP_TEST_S3_CA_BUNDLE BLOBSNAP_TEST_S3_VHOST_DOMAIN
  eval "export $(bash minio/garage.sh env | tr '\n' ' ')"
  bounded 1200 cargo test --locked --tests -- --ignored external::
)
bash minio/garage.sh stop

stage "Garage 3-node cluster: node loss under the demo job"
bounded 900 cargo test --locked --test garage_cluster -- --ignored --nocapture

stage "interoperability: a RocksDB 7.8 database (Debian rocksdb-tools' ldb) through backup --db and restore"
bounded 600 cargo test --locked --test it -- --ignored --nocapture interop::

stage "bounded resources at the default sizes (5,000 small files, one 256 MiB file; no server)"
bounded 900 cargo test --locked --test bounded -- --ignored --nocapture

stage "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps

stage "done"

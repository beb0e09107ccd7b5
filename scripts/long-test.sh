#!/usr/bin/env bash
# The long tests, in one command (not in CI: they take tens of minutes):
#
#   scripts/long-test.sh
#
# 1. faults on the wire: the demo through the HTTP fault proxy (10 % of requests: 500, 503
#    SlowDown, reset, lost/cut response, 2 s delay) for >= 500 commits, on the in-process
#    s3s-fs server and on LocalStack;
# 2. the full crash matrix: SIGKILL at every named point of claim, restore, commit, cleanup and
#    sweep, 25 seeded runs per point, on a restart on the same host and on a new one, each
#    followed by a grace-0 sweep that must leave exactly the referenced objects; then every
#    point against LocalStack, 5 seeded runs each (BLOBSNAP_CRASH_POINTS=a,b repeats chosen
#    points only);
# 3. fuzzing: 10 minutes per target (checkpoint reader, index reader, marker/id/key/scope
#    parsers) with the seeded mutational fuzzer and its counting allocator (CI runs it on
#    50,000 inputs per target instead), then 10 more per
#    target coverage-guided (libFuzzer, scripts/fuzz.sh) from the seeds in fuzz/corpus/;
# 4. the GC model: 10,000 randomized interleavings of commits (with retention cleanup and
#    abandon-after-grace/2) and sweeps over a virtual-clock object store, then 1,000,000
#    steps of it through time (savepoints, a fork, tiered retention); the crash soak: 5
#    rounds of SIGKILLs at every crash point, then one sweep leaves nothing past the grace;
# 5. bounded resources: 100,000 small files and one 8 GiB file through backup and restore
#    (peak RSS and open descriptors asserted; needs ~25 GiB free under /var/tmp);
# 6. the property tests (index, checkpoint, marker and key parsers, diff) with 100x their
#    usual case counts.
#
# The installs (the only steps that use the network) come first; everything after them runs in
# a network namespace whose only interface is loopback (scripts/netns.sh), as in test.sh.
#
# Set CARGO_TARGET_DIR to reuse a build directory. Prints each stage's duration; each stage is
# bounded (`bounded` in scripts/stage.sh), so a hang ends it with a message naming it.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/stage.sh

if [ "${1:-}" != --suites ]; then
  stage "build prerequisites"
  bash scripts/prereqs.sh
  bash scripts/prereqs.sh --tools curl python3 flock setsid cksum openssl ip unshare

  stage "installs: LocalStack, cargo-fuzz, the crates"
  bash minio/localstack.sh install
  bash scripts/fuzz.sh --install
  cargo fetch --locked

  export BLOBSNAP_REQUIRE_NETNS=1
  export CARGO_NET_OFFLINE=true
  exec bash scripts/netns.sh bash scripts/long-test.sh --suites
fi

export AWS_EC2_METADATA_DISABLED=true
stage "the namespace: loopback only (the interfaces, checked by a test)"
bounded 2400 cargo test --locked --release --test it -- --ignored --exact loopback_only::the_namespace_has_only_loopback

stage "LocalStack (network namespace: ${BLOBSNAP_NETNS:-none})"
bash minio/localstack.sh start
trap 'bash minio/localstack.sh stop' EXIT

stage "faults on the wire: >= 500 commits through 10 % faulty requests (s3s-fs in-process)"
BLOBSNAP_SOAK_COMMITS=${BLOBSNAP_SOAK_COMMITS:-500} \
  bounded 3600 cargo test --locked --release --test it -- --nocapture faults::demo_commits_through_a_faulty_wire_s3s

stage "faults on the wire: >= 500 commits through 10 % faulty requests (LocalStack)"
(
  eval "export $(bash minio/localstack.sh env | tr '\n' ' ')"
  BLOBSNAP_SOAK_COMMITS=${BLOBSNAP_SOAK_COMMITS:-500} \
    bounded 3600 cargo test --locked --release --test it -- --ignored --nocapture faults::external::
)

stage "crash matrix: 25 seeded runs per point"
BLOBSNAP_CRASH_RUNS=${BLOBSNAP_CRASH_RUNS:-25} \
  bounded 7200 cargo test --locked --release --test it -- --nocapture lifecycle::demo_survives_kill_9_local lifecycle::sweep_after_kills_leaves_exactly_the_referenced_objects

stage "crash matrix against LocalStack: every point, 5 seeded runs per point"
(
  eval "export $(bash minio/localstack.sh env | tr '\n' ' ')"
  BLOBSNAP_CRASH_POINTS=${BLOBSNAP_CRASH_POINTS:-all} BLOBSNAP_CRASH_RUNS=${BLOBSNAP_LOCALSTACK_CRASH_RUNS:-5} \
    bounded 7200 cargo test --locked --release --test it -- --ignored --nocapture lifecycle::external::demo_survives_the_crash_matrix
)

stage "fuzzing: 10 minutes per target"
BLOBSNAP_FUZZ_SECS=${BLOBSNAP_FUZZ_SECS:-600} bounded 3600 cargo test --locked --release --test it -- --nocapture fuzz::

stage "coverage-guided fuzzing (libFuzzer via cargo-fuzz): 10 minutes per target"
bounded 7200 bash scripts/fuzz.sh "${BLOBSNAP_LIBFUZZER_SECS:-600}"

stage "GC model: 10,000 randomized interleavings of commits, cleanups and sweeps; 1,000,000 steps of savepoints, a fork and tiered retention"
BLOBSNAP_GC_INTERLEAVINGS=${BLOBSNAP_GC_INTERLEAVINGS:-10000} BLOBSNAP_GC_MODEL_STEPS=${BLOBSNAP_GC_MODEL_STEPS:-1000000} \
  bounded 10800 cargo test --locked --release --test it -- --nocapture gc_model::

stage "crash soak: 5 rounds of SIGKILLs at every crash point, then one sweep leaves nothing past the grace"
BLOBSNAP_SOAK_ROUNDS=${BLOBSNAP_SOAK_ROUNDS:-5} bounded 3600 cargo test --locked --release --test it -- --nocapture lifecycle::a_crash_soak

stage "bounded resources: 100,000 small files and one 8 GiB file, backed up and restored"
BLOBSNAP_BOUNDED_FILES=${BLOBSNAP_BOUNDED_FILES:-100000} BLOBSNAP_BOUNDED_BIG_MIB=${BLOBSNAP_BOUNDED_BIG_MIB:-8192} \
  bounded 7200 cargo test --locked --release --test bounded -- --ignored --nocapture

stage "property tests with 100x cases"
PROPTEST_CASES=${PROPTEST_CASES:-25600} bounded 7200 cargo test --locked --release --lib
PROPTEST_CASES=${PROPTEST_CASES:-25600} bounded 3600 cargo test --locked --release --test it -- formats::

stage "done"

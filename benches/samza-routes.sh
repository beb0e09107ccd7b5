#!/usr/bin/env bash
# Issue 50's targets: route 1 (blobsnap's engine through JNI) against route 2 (Samza 1.8.0's own
# blob-store engine through S3BlobStoreManager) on one RocksJava store, against the S3 server
# of BLOBSNAP_TEST_S3_* (start one: `bash minio/localstack.sh start; eval "export $(bash
# minio/localstack.sh env | tr '\n' ' ')"`, or minio/garage.sh). Numbers in RESULTS.md §8.
#
#   benches/samza-routes.sh [--mib 1024] [--commits 10] [--write-mib 16] [--transfers 16]
#
# Uses the release library (built here like scripts/samza-jar.sh builds it, about 15 minutes
# cold) and the Java modules' classes (scripts/samza.sh --offline builds them).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BLOBSNAP_TEST_S3_ENDPOINT:?start an S3 server on loopback and export BLOBSNAP_TEST_S3_* (see the header)}"
bash scripts/prereqs.sh --tools java javac mvn g++
target=${CARGO_TARGET_DIR:-$PWD/target}
lib=${BLOBSNAP_BENCH_LIB:-$target/release/libblobsnap_samza_jni.so}
if [ -z "${BLOBSNAP_BENCH_LIB:-}" ]; then
  libstdcxx=$(g++ -print-file-name=libstdc++.a)
  CXXSTDLIB= BLOBSNAP_STATIC_LIBSTDCXX_DIR=$(dirname "$libstdcxx") \
    cargo build --release --locked -p blobsnap-samza-jni
fi
(cd samza-s3 && mvn -B -q -ntp -o -DskipTests install)
(cd samza && mvn -B -q -ntp -o -DskipTests test-compile dependency:build-classpath -Dmdep.outputFile=target/test-classpath.txt -Dmdep.includeScope=test)
cp=samza/target/test-classes:samza/target/classes:$(cat samza/target/test-classpath.txt)
export AWS_ACCESS_KEY_ID=${BLOBSNAP_TEST_S3_ACCESS_KEY:-test} AWS_SECRET_ACCESS_KEY=${BLOBSNAP_TEST_S3_SECRET_KEY:-test}
export AWS_EC2_METADATA_DISABLED=true
work=${BLOBSNAP_BENCH_WORK:-$(mktemp -d /var/tmp/blobsnap-routes-XXXXXX)}
echo "samza-routes: $(date -u +%FT%TZ), ${BLOBSNAP_TEST_S3_SERVER:-S3} at $BLOBSNAP_TEST_S3_ENDPOINT, library $lib"
java -Xmx2g -Dblobsnap.native.lib="$lib" -cp "$cp" blobsnap.bench.RoutesBench "$work" "$@"
rm -rf "$work"

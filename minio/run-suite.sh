#!/usr/bin/env bash
# Run the external-endpoint conformance suite against an S3 server that is already running.
#
#   minio/run-suite.sh minio         # MinIO on 127.0.0.1:9000 (minioadmin/minioadmin)
#   minio/run-suite.sh localstack    # LocalStack on 127.0.0.1:4566 (test/test)
#   minio/run-suite.sh garage        # Garage started by minio/garage.sh (one node, port 3900)
#   BLOBSNAP_TEST_S3_ENDPOINT=... BLOBSNAP_TEST_S3_ACCESS_KEY=... BLOBSNAP_TEST_S3_SECRET_KEY=... \
#     minio/run-suite.sh custom      # anything else (AWS: set BLOBSNAP_TEST_S3_PATH_STYLE=false)
#
# The suite fails if the server is not reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  minio)
    export BLOBSNAP_TEST_S3_ENDPOINT=${BLOBSNAP_TEST_S3_ENDPOINT:-http://127.0.0.1:9000}
    export BLOBSNAP_TEST_S3_ACCESS_KEY=${BLOBSNAP_TEST_S3_ACCESS_KEY:-minioadmin}
    export BLOBSNAP_TEST_S3_SECRET_KEY=${BLOBSNAP_TEST_S3_SECRET_KEY:-minioadmin}
    # MinIO has no object-lifecycle-free limitations we rely on; it lists multipart uploads.
    ;;
  localstack)
    eval "export $(bash minio/localstack.sh env | tr '\n' ' ')"
    ;;
  garage)
    eval "export $(bash minio/garage.sh env | tr '\n' ' ')"
    ;;
  custom)
    : "${BLOBSNAP_TEST_S3_ENDPOINT:?set BLOBSNAP_TEST_S3_ENDPOINT}"
    ;;
  *) echo "usage: $0 minio|localstack|garage|custom" >&2; exit 2 ;;
esac
echo "running every external:: suite against $BLOBSNAP_TEST_S3_ENDPOINT" >&2
cargo test --locked --tests -- --ignored external::

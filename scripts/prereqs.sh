#!/usr/bin/env bash
# Install what building blobsnap needs on a fresh Debian machine of this project's kind:
# libclang (RocksDB's bindgen). Idempotent; uses sudo when not root.
set -euo pipefail
if ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
  exit 0
fi
echo "prereqs: installing libclang-dev (RocksDB's bindgen needs it)" >&2
if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libclang-dev >/dev/null

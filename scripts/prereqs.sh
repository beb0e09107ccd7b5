#!/usr/bin/env bash
# What building and testing blobsnap needs on a fresh Debian 12 machine of this project's kind,
# detected by the criterion the tool that needs it uses, installed when missing (apt; sudo when
# not root). Idempotent.
#
#   scripts/prereqs.sh                  # the build: libclang (RocksDB's bindgen), a C++ compiler
#   scripts/prereqs.sh --check-libclang # only say "found PATH" (exit 0) or "missing" (exit 1)
#   scripts/prereqs.sh --tools T...     # each tool T present, or installed from its package
#
# libclang: librocksdb-sys runs bindgen, whose clang-sys loads `libclang.so`, `libclang.so.N`,
# `libclang-N.so` or `libclang-N.so.M` from $LIBCLANG_PATH or from the LLVM and system library
# dirs. `libclang-cpp.so.N` (Debian's libclang-cpp14, present on a fresh machine) is the C++
# interface library, which bindgen never loads: it does not count. When nothing matches, the
# script installs libclang-dev. BLOBSNAP_PREREQS_ROOT (default /) is the root the dirs are
# looked for under (tests/it/prereqs.rs points it at a temporary tree).
set -euo pipefail

ROOT=${BLOBSNAP_PREREQS_ROOT:-}
ROOT=${ROOT%/}

# The file names clang-sys accepts, and not libclang-cpp.
is_libclang() {
  local name=${1##*/}
  [[ $name =~ ^libclang(-[0-9][0-9.]*)?\.so(\.[0-9]+)*$ ]]
}

# Prints the first libclang found and returns 0, or returns 1.
find_libclang() {
  local dirs=()
  if [ -n "${LIBCLANG_PATH:-}" ]; then
    # clang-sys: LIBCLANG_PATH is a directory, or the library file itself.
    if [ -f "$LIBCLANG_PATH" ] && is_libclang "$LIBCLANG_PATH"; then
      echo "$LIBCLANG_PATH"; return 0
    fi
    dirs+=("$LIBCLANG_PATH")
  fi
  local d
  for d in "$ROOT"/usr/lib/llvm-*/lib "$ROOT"/usr/lib/llvm-*/lib64 "$ROOT"/usr/local/llvm*/lib \
    "$ROOT"/usr/local/lib "$ROOT"/usr/lib/*-linux-gnu "$ROOT"/usr/lib64 "$ROOT"/usr/lib; do
    [ -d "$d" ] && dirs+=("$d")
  done
  local f
  for d in "${dirs[@]}"; do
    for f in "$d"/libclang*.so*; do
      [ -e "$f" ] || continue
      if is_libclang "$f"; then echo "$f"; return 0; fi
    done
  done
  return 1
}

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
apt_updated=0
apt_install() {
  echo "prereqs: installing $* (apt)" >&2
  if [ "$apt_updated" = 0 ]; then $SUDO apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

# tool -> the Debian package that provides it.
package_of() {
  case "$1" in
    /usr/bin/time) echo time ;;
    c++|g++) echo g++ ;;
    setsid|flock|unshare) echo util-linux ;;
    ip) echo iproute2 ;;
    ldb) echo rocksdb-tools ;;
    java|javac|jar) echo openjdk-17-jdk-headless ;;
    mvn) echo maven ;;
    readelf|objdump|strip) echo binutils ;;
    *) echo "$1" ;;
  esac
}

tools() {
  local t missing=()
  for t in "$@"; do
    if [ "${t#/}" != "$t" ]; then [ -x "$t" ] || missing+=("$(package_of "$t")")
    else command -v "$t" >/dev/null 2>&1 || missing+=("$(package_of "$t")"); fi
  done
  [ ${#missing[@]} = 0 ] && return 0
  apt_install "${missing[@]}"
  for t in "$@"; do
    if [ "${t#/}" != "$t" ]; then [ -x "$t" ] && continue
    else command -v "$t" >/dev/null 2>&1 && continue; fi
    echo "prereqs: $t is still missing after installing package $(package_of "$t")" >&2
    exit 1
  done
}

case "${1:-}" in
  --check-libclang)
    if p=$(find_libclang); then echo "found $p"; exit 0; else echo "missing"; exit 1; fi
    ;;
  --tools)
    shift
    tools "$@"
    ;;
  "")
    tools c++ make
    if ! find_libclang >/dev/null; then
      echo "prereqs: no libclang that bindgen loads (libclang.so / libclang-N.so[.*]; libclang-cpp does not count)" >&2
      apt_install libclang-dev
      if ! p=$(find_libclang); then
        echo "prereqs: libclang-dev installed but no libclang found; set LIBCLANG_PATH to the directory holding libclang.so" >&2
        exit 1
      fi
      echo "prereqs: $p" >&2
    fi
    ;;
  *) echo "usage: $0 [--check-libclang | --tools TOOL...]" >&2; exit 2 ;;
esac

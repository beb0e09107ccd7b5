#!/usr/bin/env bash
# The Samza plug-in's jar as a user gets it (docs/samza.md, "Getting the jar"):
# samza/target/blobsnap-samza-<version>.jar, with blobsnap's JNI library inside for Linux x86-64
# (a release build; libstdc++ linked statically; only its Java_* entry points exported), and the
# oldest glibc it runs on printed. Samza's jars are `provided`: the job has them.
#
#   scripts/samza-jar.sh            # Maven online (a first run fetches its plugins)
#   scripts/samza-jar.sh --offline  # once the local Maven repository has them
#
# The release build compiles RocksDB once more (about 15 minutes on 2 cores, cold).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prereqs.sh --tools java javac jar mvn g++ readelf objdump strip
offline=()
[ "${1:-}" = --offline ] && offline=(-o)
target=${CARGO_TARGET_DIR:-$PWD/target}
# The C++ standard library, linked in statically: cc (RocksDB's C++ build and the lazy file
# system's) links none (CXXSTDLIB empty), samza/native/build.rs links libstdc++.a.
libstdcxx=$(g++ -print-file-name=libstdc++.a)
[ -f "$libstdcxx" ] || { echo "samza-jar.sh: no libstdc++.a (g++ -print-file-name: $libstdcxx)" >&2; exit 1; }
CXXSTDLIB= BLOBSNAP_STATIC_LIBSTDCXX_DIR=$(dirname "$libstdcxx") \
  cargo build --release --locked -p blobsnap-samza-jni
lib=$target/release/libblobsnap_samza_jni.so
if readelf -d "$lib" | grep -q 'NEEDED.*libstdc++'; then
  echo "samza-jar.sh: $lib still needs libstdc++.so" >&2
  exit 1
fi
floor=$(objdump -T "$lib" | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -1)
res=samza/target/native-resource/blobsnap/native/linux-x86_64
mkdir -p "$res"
strip --strip-unneeded -o "$res/libblobsnap_samza_jni.so" "$lib"
# The loader names it when the library does not load (an older glibc).
echo "${floor/GLIBC_/glibc }" > "$res/glibc-floor.txt"
# samza/'s tests use route 2's module and its test jar: installed first so that the build
# resolves on a fresh machine.
(cd samza-s3 && mvn -B -ntp -Dstyle.color=never "${offline[@]}" -DskipTests install)
(cd samza && mvn -B -ntp -Dstyle.color=never "${offline[@]}" -DskipTests package)
jar=$(ls samza/target/blobsnap-samza-*.jar)
jar tf "$jar" | grep -q '^blobsnap/native/linux-x86_64/libblobsnap_samza_jni.so$' || {
  echo "samza-jar.sh: the library is not in $jar" >&2
  exit 1
}
echo "samza-jar.sh: $jar ($(du -h "$jar" | cut -f1); the library needs ${floor/GLIBC_/glibc } or later, libstdc++ linked in)"

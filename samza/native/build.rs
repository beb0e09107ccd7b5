//! Links the JNI library with a version script (exports.map): only its `Java_*` entry points
//! are exported, so two RocksDBs (this one and rocksdbjni's) live in one JVM apart.
//!
//! For the jar (scripts/samza-jar.sh) the C++ standard library is linked in statically: the
//! script sets `CXXSTDLIB` empty (the cc builds of RocksDB and of the lazy file system then
//! link none) and `BLOBSNAP_STATIC_LIBSTDCXX_DIR` to where `libstdc++.a` is, and this links it.
//! (cc's own `CXXSTDLIB_STATIC` fails here: librocksdb-sys links the library from several
//! builds.)

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/exports.map");
    println!("cargo:rerun-if-changed=exports.map");
    println!("cargo:rerun-if-env-changed=BLOBSNAP_STATIC_LIBSTDCXX_DIR");
    if let Ok(lib_dir) = std::env::var("BLOBSNAP_STATIC_LIBSTDCXX_DIR") {
        println!("cargo:rustc-link-search=native={lib_dir}");
        println!("cargo:rustc-link-lib=static=stdc++");
    }
}

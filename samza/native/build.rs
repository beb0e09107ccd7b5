//! Links the JNI library with a version script (exports.map): only its `Java_*` entry points
//! are exported, so two RocksDBs (this one and rocksdbjni's) live in one JVM apart.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/exports.map");
    println!("cargo:rerun-if-changed=exports.map");
}

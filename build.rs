//! Compiles `cpp/lazy_fs.cc` (the lazy restore's RocksDB file system, see `src/local/lazy`)
//! against the headers of the RocksDB that librocksdb-sys builds and links, with the flags
//! that build uses for what the public headers depend on (C++20, NDEBUG, RTTI, POSIX).

fn main() {
    println!("cargo:rerun-if-changed=cpp/lazy_fs.cc");
    println!("cargo:rerun-if-env-changed=DEP_ROCKSDB_CARGO_MANIFEST_DIR");
    // librocksdb-sys (`links = "rocksdb"`) tells its direct dependents where its sources are.
    let Ok(sys) = std::env::var("DEP_ROCKSDB_CARGO_MANIFEST_DIR") else {
        panic!(
            "DEP_ROCKSDB_CARGO_MANIFEST_DIR is not set: librocksdb-sys must be a direct dependency"
        )
    };
    let include = std::path::Path::new(&sys).join("rocksdb").join("include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("cpp/lazy_fs.cc")
        .include(&include)
        .flag_if_supported("-std=c++20")
        .define("NDEBUG", Some("1"))
        .define("USE_RTTI", Some("1"))
        .define("ROCKSDB_PLATFORM_POSIX", None)
        .define("ROCKSDB_LIB_IO_POSIX", None)
        .warnings(true);
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        build.define("OS_LINUX", None);
    }
    build.compile("blobsnap_lazy_fs");
}

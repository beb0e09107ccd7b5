//! `unsafe` is denied crate-wide (Cargo.toml) and allowed in exactly one module, the lazy
//! restore's bridge to RocksDB's file system (src/local/lazy/ffi.rs, whose docs argue its
//! safety): no other source file may allow it.

#[test]
fn only_the_lazy_file_system_bridge_allows_unsafe_code() {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for d in ["src", "benches", "tests", "examples"] {
        if root.join(d).is_dir() {
            walk(&root.join(d), &mut files);
        }
    }
    let needle = ["allow(", "unsafe_code)"].concat();
    let allowed: Vec<String> = files
        .iter()
        .filter(|p| std::fs::read_to_string(p).unwrap().contains(&needle))
        .map(|p| p.strip_prefix(root).unwrap().display().to_string())
        .collect();
    assert_eq!(allowed, ["src/local/lazy/ffi.rs"]);
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains("unsafe_code = \"deny\""),
        "Cargo.toml denies unsafe code"
    );
}

//! `scripts/prereqs.sh` finds libclang by the names bindgen's clang-sys loads, never by
//! `libclang-cpp` (the C++ interface library a fresh Debian machine of this kind ships, which
//! made the old check pass while the RocksDB build failed).

use std::path::Path;
use std::process::Command;

/// Runs `prereqs.sh --check-libclang` with `root` as the filesystem root; (exit ok, stdout).
fn check(root: &Path, libclang_path: Option<&Path>) -> (bool, String) {
    let mut cmd = Command::new("bash");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/prereqs.sh"))
        .arg("--check-libclang")
        .env("BLOBSNAP_PREREQS_ROOT", root)
        .env_remove("LIBCLANG_PATH");
    if let Some(p) = libclang_path {
        cmd.env("LIBCLANG_PATH", p);
    }
    let out = cmd.output().expect("run scripts/prereqs.sh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

fn touch(root: &Path, rel: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"").unwrap();
}

#[test]
fn libclang_cpp_alone_is_missing() {
    let root = tempfile::tempdir().unwrap();
    touch(root.path(), "usr/lib/llvm-14/lib/libclang-cpp.so.14");
    touch(root.path(), "usr/lib/x86_64-linux-gnu/libclang-cpp.so.14");
    touch(root.path(), "usr/lib/llvm-14/lib/libLLVM-14.so.1");
    assert_eq!(check(root.path(), None), (false, "missing".to_string()));
}

#[test]
fn an_empty_root_is_missing() {
    let root = tempfile::tempdir().unwrap();
    assert_eq!(check(root.path(), None), (false, "missing".to_string()));
}

#[test]
fn llvm_libclang_so_1_is_found() {
    let root = tempfile::tempdir().unwrap();
    touch(root.path(), "usr/lib/llvm-14/lib/libclang-cpp.so.14");
    touch(root.path(), "usr/lib/llvm-14/lib/libclang.so.1");
    let (ok, out) = check(root.path(), None);
    assert!(ok, "{out}");
    assert_eq!(
        out,
        format!(
            "found {}",
            root.path()
                .join("usr/lib/llvm-14/lib/libclang.so.1")
                .display()
        )
    );
}

#[test]
fn versioned_names_in_the_system_dir_are_found() {
    for name in [
        "libclang.so",
        "libclang-14.so",
        "libclang-14.0.6.so",
        "libclang-14.so.1",
    ] {
        let root = tempfile::tempdir().unwrap();
        touch(root.path(), &format!("usr/lib/x86_64-linux-gnu/{name}"));
        let (ok, out) = check(root.path(), None);
        assert!(ok && out.ends_with(name), "{name}: {out}");
    }
}

#[test]
fn libclang_path_is_searched_first() {
    let root = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    touch(dir.path(), "libclang.so");
    let (ok, out) = check(root.path(), Some(dir.path()));
    assert!(ok, "{out}");
    assert!(
        out.starts_with("found ") && out.ends_with("/libclang.so"),
        "{out}"
    );
    // A LIBCLANG_PATH holding only libclang-cpp does not count either.
    let cpp = tempfile::tempdir().unwrap();
    touch(cpp.path(), "libclang-cpp.so.14");
    assert_eq!(
        check(root.path(), Some(cpp.path())),
        (false, "missing".to_string())
    );
}

//! The suite reaches only this machine.
//!
//! Tests, benches and scripts may send traffic to the loopback range (127.0.0.0/8, ::1) and
//! nowhere else, not even to an address meant to be unroutable (on the machines this project
//! runs on, 192.0.2.1 is the default gateway). Two guards:
//!
//! - structural: scripts/test.sh and scripts/long-test.sh run the suites in a network
//!   namespace whose only interface is loopback (scripts/netns.sh); inside it
//!   (`BLOBSNAP_NETNS=loopback-only`) [`the_namespace_has_only_loopback`] checks that this
//!   process sees no other interface;
//! - in the sources: [`no_source_names_an_address_off_this_machine`] reads every file of
//!   tests/, benches/, examples/, fuzz/, scripts/, minio/ and .ci/ and fails on any IPv4 or
//!   IPv6 literal outside loopback (0.0.0.0 and :: — "any", which a server binds and no client
//!   can send to — aside).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// The addresses a test may name: loopback, or the unspecified address a server binds.
fn allowed_v4(ip: Ipv4Addr) -> bool {
    ip.is_loopback() || ip.is_unspecified()
}

fn allowed_v6(ip: Ipv6Addr) -> bool {
    ip.is_loopback() || ip.is_unspecified()
}

/// Every address literal in `text` that is not allowed, as (line number, literal).
fn foreign_addresses(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        // Words of letters, digits, dots and colons: an address literal is one whole word
        // (`std::net` is a word too, and parses as no address).
        for token in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == ':')) {
            let token = token.trim_matches(|c| c == '.' || c == ':');
            if token.is_empty() {
                continue;
            }
            if let Ok(ip) = token.parse::<Ipv4Addr>() {
                if !allowed_v4(ip) {
                    found.push((n + 1, token.to_string()));
                }
                continue;
            }
            // An IPv4 address followed by a port (`10.1.2.3:80`).
            if let Some((host, port)) = token.rsplit_once(':') {
                if port.parse::<u16>().is_ok() {
                    if let Ok(ip) = host.parse::<Ipv4Addr>() {
                        if !allowed_v4(ip) {
                            found.push((n + 1, token.to_string()));
                        }
                        continue;
                    }
                }
            }
            // IPv6: at least two colons, and it parses (Rust paths like `std::net` do not:
            // they are not hex).
            if token.matches(':').count() >= 2 {
                if let Ok(ip) = token.parse::<Ipv6Addr>() {
                    if !allowed_v6(ip) {
                        found.push((n + 1, token.to_string()));
                    }
                }
            }
        }
    }
    found
}

fn text_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        // Build output and fuzzing scratch are not sources.
        if name == "target" || name == "artifacts" || name == "corpus" {
            continue;
        }
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            text_files(&p, out);
        } else if ft.is_file() {
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            if matches!(
                ext,
                "rs" | "sh" | "py" | "toml" | "yaml" | "yml" | "json" | "md" | "txt" | "cfg" | ""
            ) {
                out.push(p);
            }
        }
    }
}

#[test]
fn no_source_names_an_address_off_this_machine() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "tests", "benches", "examples", "fuzz", "scripts", "minio", ".ci",
    ] {
        text_files(&root.join(dir), &mut files);
    }
    assert!(
        files.len() > 20,
        "the scan found only {} files under {}",
        files.len(),
        root.display()
    );
    let mut bad = Vec::new();
    for f in &files {
        // This file names off-machine addresses as the examples the scan must refuse.
        if f.ends_with("tests/it/loopback_only.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(f) else {
            continue; // not text
        };
        for (line, lit) in foreign_addresses(&text) {
            bad.push(format!(
                "{}:{line}: {lit}",
                f.strip_prefix(root).unwrap_or(f).display()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "tests, benches and scripts may reach only this machine (127.0.0.0/8, ::1); these name \
         other addresses:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_scan_sees_what_it_must_refuse() {
    let text = "a 192.0.2.1 b\nlet x = \"10.0.0.5:9000\";\n[2001:db8::1]\nok 127.0.0.9 ::1 0.0.0.0 std::net::IpAddr 1.2.3";
    let found = foreign_addresses(text);
    assert_eq!(
        found,
        vec![
            (1, "192.0.2.1".to_string()),
            (2, "10.0.0.5:9000".to_string()),
            (3, "2001:db8::1".to_string()),
        ]
    );
}

/// Inside scripts/netns.sh's namespace the process sees loopback and nothing else: a
/// connection to any other address fails at once, on this machine. scripts/test.sh and
/// scripts/long-test.sh run it by name inside the namespace; run anywhere else it fails (an
/// inherited `BLOBSNAP_NETNS` proves nothing: the interfaces are what it checks).
#[test]
#[ignore = "run by scripts/test.sh inside scripts/netns.sh's namespace; fails outside it"]
fn the_namespace_has_only_loopback() {
    let dev = std::fs::read_to_string("/proc/self/net/dev").expect("read /proc/self/net/dev");
    let interfaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(
        interfaces,
        vec!["lo"],
        "the suite's namespace must have only loopback"
    );
}

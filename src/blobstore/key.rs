//! Validated object keys and scopes, and the escaping of user-supplied segments.
//!
//! Every key a [`BlobStore`](super::BlobStore) sees is a [`BlobKey`]: relative to the store's
//! root (the S3 store adds its bucket prefix in one place; the local store maps it below its
//! directory), made of non-empty `/`-separated segments, none of them `.` or `..`, with no
//! control characters. So no key can name anything outside the store's root.
//!
//! User-supplied names (job, job id, task, store) become key segments through
//! [`escape_segment`]: every byte outside `[A-Za-z0-9_-]` becomes `%XX` (uppercase hex), so
//! `.` is `%2E` and a space is `%20` (DESIGN §5). The escaping is pinned by golden tests:
//! changing it would orphan every stored snapshot.
//!
//! A [`Scope`] is a key prefix that ends in `/` (or the root, the empty prefix). Listing a scope
//! uses S3's string-prefix semantics, and because a scope ends in `/`, listing `Partition 1/`
//! never returns `Partition 10/…`.

use std::fmt;

use crate::error::{Error, Result};

/// The longest key S3 accepts, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Escape one user-supplied name into a key segment: every byte outside `[A-Za-z0-9_-]`
/// becomes `%XX` with uppercase hex digits. The result is never empty for a non-empty input,
/// never contains `/` or `.`, and is injective (distinct names give distinct segments).
pub fn escape_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(char::from(HEX[(b >> 4) as usize]));
            out.push(char::from(HEX[(b & 0xf) as usize]));
        }
    }
    out
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Reverse [`escape_segment`]. Fails on anything `escape_segment` cannot have produced.
pub fn unescape_segment(segment: &str) -> Result<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .filter(|h| {
                    h.bytes()
                        .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
                })
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| Error::invalid(format!("bad escape in key segment {segment:?}")))?;
            if hex.is_ascii_alphanumeric() || hex == b'_' || hex == b'-' {
                return Err(Error::invalid(format!(
                    "needless escape in key segment {segment:?}"
                )));
            }
            out.push(hex);
            i += 3;
        } else if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b);
            i += 1;
        } else {
            return Err(Error::invalid(format!(
                "unescaped byte {b:#04x} in key segment {segment:?}"
            )));
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::invalid(format!("key segment {segment:?} is not UTF-8")))
}

fn validate_segments(s: &str, what: &str) -> Result<()> {
    if s.len() > MAX_KEY_LEN {
        return Err(Error::invalid(format!(
            "{what} is {} bytes, longer than S3's {MAX_KEY_LEN}",
            s.len()
        )));
    }
    if s.chars().any(|c| c.is_control()) {
        return Err(Error::invalid(format!(
            "{what} {s:?} contains a control character"
        )));
    }
    for seg in s.split('/') {
        if seg.is_empty() {
            return Err(Error::invalid(format!("{what} {s:?} has an empty segment")));
        }
        if seg == "." || seg == ".." {
            return Err(Error::invalid(format!(
                "{what} {s:?} has a {seg:?} segment"
            )));
        }
        if seg.contains('\\') {
            return Err(Error::invalid(format!("{what} {s:?} contains a backslash")));
        }
    }
    Ok(())
}

/// A validated object key, relative to the root of a [`BlobStore`](super::BlobStore).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlobKey(String);

impl BlobKey {
    /// Validate `key`: non-empty `/`-separated segments, none `.` or `..`, no control
    /// characters or backslashes, at most [`MAX_KEY_LEN`] bytes.
    pub fn new(key: impl Into<String>) -> Result<Self> {
        let key = key.into();
        validate_segments(&key, "key")?;
        Ok(BlobKey(key))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key's last segment.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// The rest of the key after `scope`, if the key lies in it.
    pub fn strip_scope(&self, scope: &Scope) -> Option<&str> {
        self.0.strip_prefix(scope.as_str())
    }

    /// Whether the key lies in `scope`.
    pub fn is_in(&self, scope: &Scope) -> bool {
        self.0.starts_with(scope.as_str())
    }
}

impl fmt::Display for BlobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for BlobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobKey({:?})", self.0)
    }
}

/// A key prefix ending in `/`, or the root (the empty prefix).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Scope(String);

impl Scope {
    /// The root of the store.
    pub fn root() -> Self {
        Scope(String::new())
    }

    /// Parse a scope string: empty (the root) or valid key segments followed by `/`.
    pub fn new(scope: impl Into<String>) -> Result<Self> {
        let scope = scope.into();
        if scope.is_empty() {
            return Ok(Scope(scope));
        }
        let Some(body) = scope.strip_suffix('/') else {
            return Err(Error::invalid(format!(
                "scope {scope:?} does not end in '/'"
            )));
        };
        validate_segments(body, "scope")?;
        Ok(Scope(scope))
    }

    /// The scope as a string (`""` or ending in `/`).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A child scope named by a user-supplied name, escaped with [`escape_segment`].
    pub fn escaped(&self, name: &str) -> Result<Scope> {
        if name.is_empty() {
            return Err(Error::invalid("an empty name cannot be a key segment"));
        }
        Scope::new(format!("{}{}/", self.0, escape_segment(name)))
    }

    /// A child scope with literal, already safe segments (`"tasks"`, `"blobs/1-2"`).
    pub fn child(&self, literal: &str) -> Result<Scope> {
        Scope::new(format!("{}{}/", self.0, literal.trim_end_matches('/')))
    }

    /// The key `rest` inside this scope.
    pub fn key(&self, rest: &str) -> Result<BlobKey> {
        BlobKey::new(format!("{}{}", self.0, rest))
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({:?})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Golden values: these strings are persisted in every bucket. Never change them.
    #[test]
    fn escape_segment_golden() {
        assert_eq!(escape_segment("wordcount"), "wordcount");
        assert_eq!(escape_segment("Partition 0"), "Partition%200");
        assert_eq!(escape_segment("a.b"), "a%2Eb");
        assert_eq!(escape_segment("job_id-1"), "job_id-1");
        assert_eq!(escape_segment("../x"), "%2E%2E%2Fx");
        assert_eq!(escape_segment("%"), "%25");
        assert_eq!(escape_segment("é"), "%C3%A9");
        assert_eq!(escape_segment("a/b\0"), "a%2Fb%00");
    }

    #[test]
    fn keys_cannot_escape_the_root() {
        for bad in [
            "", "/a", "a/", "a//b", "..", "a/../b", "./a", "a/.", "a\0b", "a\\b", "a\nb",
        ] {
            assert!(BlobKey::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(BlobKey::new("a/b.c/..d").is_ok());
        assert!(BlobKey::new("x".repeat(MAX_KEY_LEN + 1)).is_err());
    }

    #[test]
    fn scopes_end_in_slash_and_do_not_match_siblings() {
        let tasks = Scope::root().child("tasks").unwrap();
        let p1 = tasks.escaped("Partition 1").unwrap();
        assert_eq!(p1.as_str(), "tasks/Partition%201/");
        let k10 = tasks.escaped("Partition 10").unwrap().key("x").unwrap();
        assert!(!k10.is_in(&p1));
        assert!(Scope::new("a").is_err());
        assert!(Scope::new("a//").is_err());
        assert!(Scope::root().escaped("").is_err());
    }

    proptest! {
        #[test]
        fn escape_round_trips_and_is_a_safe_segment(s in "\\PC{1,40}") {
            let e = escape_segment(&s);
            prop_assert!(e.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'%'));
            prop_assert_eq!(unescape_segment(&e).unwrap(), s.clone());
            prop_assert!(Scope::root().escaped(&s).is_ok());
        }
    }
}

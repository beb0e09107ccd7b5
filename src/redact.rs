//! Credentials never reach a log line.
//!
//! The AWS SDK logs the resolved identity, access key id included, at trace and debug level
//! (it redacts only the secret key), and an S3 server embedded in a test logs the
//! `Authorization` header. blobsnap therefore keeps a process-wide set of the credential
//! values it has seen — registered when an [`S3Store`](crate::blobstore::s3::S3Store) is
//! built with explicit keys, and every time the credential chain hands out new ones (session
//! tokens rotate) — and [`RedactingWriter`] replaces each of them with `[redacted]` in what a
//! `tracing` subscriber writes. The `blobsnap` command installs it; an embedding application
//! that logs at debug or trace level should too:
//!
//! ```no_run
//! tracing_subscriber::fmt()
//!     .with_writer(blobsnap::redact::RedactingWriter::new(std::io::stderr))
//!     .init();
//! ```

use std::io::Write;
use std::sync::RwLock;

#[cfg(feature = "subscriber")]
use tracing_subscriber::fmt::MakeWriter;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Remember `secret` (an access key id, a secret key, a session token) so that it is scrubbed
/// from logs and messages. Values shorter than 8 characters are ignored (they would redact
/// ordinary words).
pub fn register(secret: &str) {
    if secret.len() < 8 {
        return;
    }
    let mut s = SECRETS.write().unwrap_or_else(|p| p.into_inner());
    if !s.iter().any(|k| k == secret) {
        s.push(secret.to_string());
        // Longest first, so a secret containing another is replaced whole.
        s.sort_by_key(|k| std::cmp::Reverse(k.len()));
    }
}

/// Register the credentials found in the standard environment variables.
pub fn register_env() {
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ] {
        if let Ok(v) = std::env::var(var) {
            register(&v);
        }
    }
}

/// `text` with every registered secret replaced by [`REDACTED`].
pub fn scrub(text: &str) -> std::borrow::Cow<'_, str> {
    let s = SECRETS.read().unwrap_or_else(|p| p.into_inner());
    if !s.iter().any(|k| text.contains(k.as_str())) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = text.to_string();
    for k in s.iter() {
        out = out.replace(k.as_str(), REDACTED);
    }
    std::borrow::Cow::Owned(out)
}

/// A `tracing_subscriber` `MakeWriter` (feature `subscriber`, on by default) whose writers
/// scrub registered secrets from every write (a `tracing` subscriber writes each formatted
/// event with one call).
#[derive(Clone, Debug)]
pub struct RedactingWriter<M>(M);

impl<M> RedactingWriter<M> {
    /// Wrap a writer factory (`std::io::stderr`, a file, …).
    pub fn new(inner: M) -> Self {
        RedactingWriter(inner)
    }
}

/// One writer of [`RedactingWriter`].
#[derive(Debug)]
pub struct Redacting<W>(W);

impl<W: Write> Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self.0.write_all(scrub(text).as_bytes())?,
            Err(_) => self
                .0
                .write_all(scrub(&String::from_utf8_lossy(buf)).as_bytes())?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(feature = "subscriber")]
impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for RedactingWriter<M> {
    type Writer = Redacting<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        Redacting(self.0.make_writer())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_values_are_scrubbed_and_short_ones_ignored() {
        register("AKIAEXAMPLEREDACT1");
        register("abc");
        let s = scrub("Credential=AKIAEXAMPLEREDACT1/2026 abc");
        assert_eq!(s, "Credential=[redacted]/2026 abc");
        let mut out = Vec::new();
        Redacting(&mut out)
            .write_all(b"key AKIAEXAMPLEREDACT1 end")
            .unwrap();
        assert_eq!(out, b"key [redacted] end");
    }
}

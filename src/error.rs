//! The one public error type of the crate.
//!
//! An [`Error`] carries an [`ErrorKind`] that tells the caller what it can do about it
//! (DESIGN §9), a message, a chain of context strings (key, store, checkpoint id) and the
//! underlying source. Context is added with [`Error::context`], which never changes the kind:
//! Samza lost its retry and "deleted" detection by wrapping errors inside a retried closure
//! (reference §6.5); here a wrapped error is still exactly as retryable as before.

use std::fmt;

/// What a caller can do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A referenced blob, index or checkpoint does not exist.
    NotFound,
    /// Data failed a check: checksum or size mismatch, unparsable index or checkpoint.
    Corrupt,
    /// Bad input: a malformed marker, key or name, bad configuration. Fix the input.
    InvalidInput,
    /// A passing fault (timeout, 5xx, throttling, connection reset): retrying may succeed.
    Transient,
    /// Will not succeed by retrying: authentication, permissions, missing bucket, an
    /// operation the store does not support.
    Permanent,
    /// Lost a create-only write: another writer got there first.
    Conflict,
    /// A local I/O error.
    Io,
    /// The operation was cancelled by its caller.
    Cancelled,
}

impl ErrorKind {
    /// A short stable name (`not-found`, `corrupt`, …) used in logs and JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not-found",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::InvalidInput => "invalid-input",
            ErrorKind::Transient => "transient",
            ErrorKind::Permanent => "permanent",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Io => "io",
            ErrorKind::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The crate's error: a kind, a message, context and an optional source.
pub struct Error {
    kind: ErrorKind,
    message: String,
    context: Vec<String>,
    source: Option<Source>,
    throttling: bool,
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            context: Vec::new(),
            source: None,
            throttling: false,
        }
    }

    /// Mark this error as the store asking the client to slow down (S3 `503 SlowDown`,
    /// `429 Too Many Requests`): the transfer budget narrows for the whole process
    /// ([`crate::blobstore::limit`]). The kind is unchanged (such an error is `Transient`).
    pub fn throttling(mut self) -> Self {
        self.throttling = true;
        self
    }

    /// Whether the store answered that the client should slow down.
    pub fn is_throttling(&self) -> bool {
        self.throttling
    }

    /// Attach an underlying cause.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Add a context line (outermost last); the kind is unchanged.
    pub fn context(mut self, context: impl Into<String>) -> Self {
        self.context.push(context.into());
        self
    }

    /// What the caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The underlying error this one was built from, if any (already part of `Display`).
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }

    /// The message without context.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether this is (or was caused by) a full disk (ENOSPC).
    pub fn is_no_space(&self) -> bool {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = self
            .source
            .as_ref()
            .map(|s| s.as_ref() as &(dyn std::error::Error + 'static));
        while let Some(e) = cur {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if io.raw_os_error() == Some(28) {
                    return true;
                }
            }
            cur = e.source();
        }
        false
    }

    /// Whether retrying the same operation may succeed.
    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Transient
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub(crate) fn corrupt(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupt, message)
    }
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }
    pub(crate) fn transient(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transient, message)
    }
    pub(crate) fn permanent(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Permanent, message)
    }
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }

    /// A local I/O error about `what` (a path or an operation).
    /// A background task (`spawn`, `spawn_blocking`) that did not return: cancelled (the
    /// runtime is shutting down) is `Cancelled`, a panic is `Io` with the panic's message.
    pub(crate) fn task(what: &str, err: tokio::task::JoinError) -> Self {
        if err.is_cancelled() {
            Self::new(ErrorKind::Cancelled, format!("{what} task was cancelled"))
        } else {
            Self::new(ErrorKind::Io, format!("{what} task panicked: {err}"))
        }
    }

    pub(crate) fn io(what: impl fmt::Display, err: std::io::Error) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::Interrupted | std::io::ErrorKind::TimedOut => ErrorKind::Transient,
            _ => ErrorKind::Io,
        };
        Self::new(kind, format!("{what}")).with_source(err)
    }

    /// [`io`](Self::io) for `map_err`: `.map_err(Error::io_with(format!("fsync {}", …)))`.
    pub(crate) fn io_with(what: impl fmt::Display) -> impl FnOnce(std::io::Error) -> Self {
        move |e| Self::io(what, e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.context.iter().rev() {
            write!(f, "{c}: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
            let mut next = source.source();
            while let Some(s) = next {
                write!(f, ": {s}")?;
                next = s.source();
            }
        }
        write!(f, " [{}]", self.kind)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("context", &self.context)
            .field("source", &self.source.as_ref().map(|s| s.to_string()))
            .finish()
    }
}

/// `Display` prints the whole chain (context, message, every cause, kind), so `source()`
/// returns `None`: a reporter that walks sources (anyhow, eyre, tracing's error fields)
/// prints each cause once. Code that needs the cause itself uses [`Error::cause`].
impl std::error::Error for Error {}

/// Extension to add context to a `Result` without changing its kind.
pub trait ResultExt<T> {
    /// Add a context line to the error, if any.
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| e.context(context()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_is_printed_once() {
        let io = std::io::Error::other("disk on fire");
        let e = Error::io("write 000007.sst", io).context("store counts");
        let shown = e.to_string();
        assert_eq!(shown.matches("disk on fire").count(), 1, "{shown}");
        // A reporter that prints Display and then walks source() repeats nothing.
        let mut report = shown.clone();
        let mut next = std::error::Error::source(&e);
        while let Some(s) = next {
            report.push_str(&format!(": {s}"));
            next = s.source();
        }
        assert_eq!(report, shown);
        assert_eq!(
            e.cause().map(|c| c.to_string()).as_deref(),
            Some("disk on fire")
        );
    }

    #[test]
    fn context_keeps_kind_and_reads_outermost_first() {
        let e = Error::transient("503 SlowDown")
            .context("put blobs/1-1/abc")
            .context("store s1");
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert!(e.is_transient());
        assert_eq!(
            e.to_string(),
            "store s1: put blobs/1-1/abc: 503 SlowDown [transient]"
        );
    }

    #[test]
    fn io_not_found_maps_to_not_found() {
        let e = Error::io(
            "open /x",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }
}

//! SHA-256 digests and the one-read file hasher (SHA-256 and CRC32 together).

use std::fmt;
use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use sha2::Digest as _;

use crate::error::{Error, Result};

/// A SHA-256 digest: the identity of a blob's content and of an index's bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sha256([u8; 32]);

impl Sha256 {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Sha256(sha2::Sha256::digest(bytes).into())
    }

    /// Wrap raw digest bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Sha256(bytes)
    }

    /// The raw digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, as used in keys and indexes.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Standard base64, as S3's `x-amz-checksum-sha256` header wants it.
    pub fn to_base64(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(self.0)
    }
}

impl FromStr for Sha256 {
    type Err = Error;

    /// Parse 64 lowercase hex digits.
    fn from_str(s: &str) -> Result<Self> {
        if s.len() != 64
            || !s
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(Error::invalid(format!(
                "{s:?} is not a SHA-256 (64 lowercase hex digits)"
            )));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out)
            .map_err(|e| Error::invalid(format!("{s:?} is not a SHA-256: {e}")))?;
        Ok(Sha256(out))
    }
}

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256({})", self.to_hex())
    }
}

impl serde::Serialize for Sha256 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Sha256 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Incremental SHA-256 + CRC32 + byte count over one stream of bytes.
#[derive(Clone, Default)]
pub struct Hasher {
    sha: sha2::Sha256,
    crc: crc32fast::Hasher,
    len: u64,
}

impl Hasher {
    /// A fresh hasher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        self.crc.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// Bytes fed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was fed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Finish: the digests and the byte count.
    pub fn finish(self) -> FileDigest {
        FileDigest {
            sha256: Sha256(self.sha.finalize().into()),
            crc32: self.crc.finalize(),
            size: self.len,
        }
    }
}

/// What one read of a file yields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileDigest {
    /// SHA-256 of the bytes.
    pub sha256: Sha256,
    /// CRC32 (IEEE, as java.util.zip) of the bytes.
    pub crc32: u32,
    /// Number of bytes read.
    pub size: u64,
}

/// Bytes this process has read from local files to hash them ([`hash_file`]), so far.
pub fn bytes_hashed() -> u64 {
    BYTES_HASHED.load(std::sync::atomic::Ordering::Relaxed)
}

static BYTES_HASHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Count `n` bytes read back from a local file to hash it elsewhere than [`hash_file`].
pub(crate) fn count_hashed(n: u64) {
    BYTES_HASHED.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

/// Hash a file in one sequential read (blocking: call from `spawn_blocking`).
pub fn hash_file(path: &Path) -> Result<FileDigest> {
    let mut file =
        std::fs::File::open(path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let mut hasher = Hasher::new();
    // A buffer of the file's size (+1 to see its end in one read), up to 1 MiB: the small
    // files a commit hashes every time (MANIFEST, OPTIONS, CURRENT) do not pay for zeroing
    // a megabyte.
    let len = file.metadata().map_or(1 << 20, |m| m.len());
    let mut buf = vec![0u8; len.saturating_add(1).clamp(4096, 1 << 20) as usize];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        count_hashed(n as u64);
    }
    Ok(hasher.finish())
}

/// Hash `paths` on up to one thread per core (at most 8; blocking: call from
/// `spawn_blocking`). Results in the order of `paths`.
pub fn hash_files_in_parallel(paths: &[&Path]) -> Vec<Result<FileDigest>> {
    // A few small files (a commit's MANIFEST, OPTIONS, CURRENT) are hashed here: starting
    // threads would cost more than hashing them.
    let small = paths.len() <= 1
        || paths
            .iter()
            .map(|p| std::fs::metadata(p).map_or(u64::MAX, |m| m.len()))
            .try_fold(0u64, |sum, len| sum.checked_add(len))
            .is_some_and(|total| total <= 1 << 20);
    if small {
        return paths.iter().map(|p| hash_file(p)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out: Vec<std::sync::Mutex<Option<Result<FileDigest>>>> =
        paths.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8)
        .min(paths.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(p) = paths.get(i) else { break };
                let d = hash_file(p);
                if let Ok(mut slot) = out[i].lock() {
                    *slot = Some(d);
                }
            });
        }
    });
    out.into_iter()
        .zip(paths)
        .map(|(slot, p)| {
            slot.into_inner().ok().flatten().unwrap_or_else(|| {
                Err(Error::new(
                    crate::error::ErrorKind::Io,
                    format!("hash {}: the hashing thread failed", p.display()),
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        let d = {
            let mut h = Hasher::new();
            h.update(b"a");
            h.finish()
        };
        assert_eq!(
            d.sha256.to_hex(),
            "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
        );
        // java.util.zip.CRC32 of "a"
        assert_eq!(d.crc32, 3_904_355_907);
        assert_eq!(d.size, 1);
        assert_eq!(Sha256::of(b"a"), d.sha256);
        assert_eq!(
            d.sha256.to_base64(),
            "ypeBEsobvcr6wjGzmiPcTaeG7/gUfE5yuYB3ha/uSLs="
        );
    }

    #[test]
    fn parse_rejects_bad_hex() {
        assert!("ab".parse::<Sha256>().is_err());
        assert!("G".repeat(64).parse::<Sha256>().is_err());
        assert!(
            "A".repeat(64).parse::<Sha256>().is_err(),
            "uppercase is not canonical"
        );
        let s = Sha256::of(b"x");
        assert_eq!(s.to_hex().parse::<Sha256>().unwrap(), s);
    }
}

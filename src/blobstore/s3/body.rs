//! A GET's body: the range the server served, checked, and a floor on its pace.

use super::*;

/// Parse the total size out of `Content-Range: bytes a-b/total`.
/// What a GET response carries: `(object size, bytes the body carries, bytes asked for)`, or
/// `None` when only a HEAD can tell (no `Content-Range` and no `Content-Length`: a chunked
/// body). A response to a ranged GET without `Content-Range` carries the whole object (the
/// server ignored `Range`): the caller cuts it to the range.
/// `(object size, bytes the body carries, bytes asked for)`.
pub(super) type Served = (u64, Range<u64>, Range<u64>);

pub(super) fn served_range(
    key: &BlobKey,
    range: Option<&Range<u64>>,
    content_range: Option<&str>,
    body_len: Option<u64>,
) -> Result<Option<Served>> {
    let (total, served) = match (range, content_range) {
        (Some(_), Some(cr)) => {
            let (served, total) = parse_content_range(cr).ok_or_else(|| {
                Error::transient(format!("get {key}: unparsable Content-Range {cr:?}"))
            })?;
            (total, served)
        }
        (_, _) => match body_len {
            Some(n) => (n, 0..n),
            None => return Ok(None),
        },
    };
    let want = range.cloned().unwrap_or(0..total);
    if want.end > total {
        return Err(Error::invalid(format!(
            "range {want:?} is outside object {key} of {total} bytes"
        )));
    }
    if served != want && !(served.start == 0 && served.end == total) {
        return Err(Error::transient(format!(
            "get {key}: asked for bytes {want:?}, the server sent {served:?}"
        )));
    }
    Ok(Some((total, served, want)))
}

/// `bytes FIRST-LAST/TOTAL` → (FIRST..LAST+1, TOTAL).
pub(super) fn parse_content_range(cr: &str) -> Option<(Range<u64>, u64)> {
    let rest = cr.trim().strip_prefix("bytes")?.trim_start();
    let (span, total) = rest.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let (first, last, total): (u64, u64, u64) = (
        first.trim().parse().ok()?,
        last.trim().parse().ok()?,
        total.trim().parse().ok()?,
    );
    (first <= last && last < total).then(|| (first..last + 1, total))
}

/// The slowest body accepted: at least `min_bytes_per_sec` on average over every `window`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pace {
    window: Duration,
    min_bytes_per_sec: u64,
}

impl Pace {
    pub(super) fn new(window: Duration, min_bytes_per_sec: u64) -> Self {
        Pace {
            window: window.max(Duration::from_millis(1)),
            min_bytes_per_sec,
        }
    }

    /// Bytes a window must deliver.
    fn floor(&self) -> u64 {
        (self.min_bytes_per_sec as f64 * self.window.as_secs_f64()) as u64
    }
}

/// A GET body as blobsnap's stream: `skip` bytes dropped (a server that ignored `Range`),
/// then at most `take` bytes, then the connection dropped; each `pace.window` must deliver
/// `pace.floor()` bytes, else `Transient` (a trickling server).
pub(super) fn body_stream(
    key: BlobKey,
    body: aws_sdk_s3::primitives::ByteStream,
    skip: u64,
    take: u64,
    pace: Pace,
) -> BoxStream<'static, Result<bytes::Bytes>> {
    struct St {
        body: aws_sdk_s3::primitives::ByteStream,
        skip: u64,
        take: u64,
        window_start: tokio::time::Instant,
        in_window: u64,
    }
    let st = St {
        body,
        skip,
        take,
        window_start: tokio::time::Instant::now(),
        in_window: 0,
    };
    futures::stream::try_unfold(st, move |mut st| {
        let key = key.clone();
        async move {
            loop {
                if st.take == 0 {
                    return Ok(None);
                }
                let next = if pace.min_bytes_per_sec > 0 {
                    tokio::time::timeout_at(st.window_start + pace.window, st.body.try_next())
                        .await
                        .ok()
                } else {
                    Some(st.body.try_next().await)
                };
                if let Some(Ok(Some(c))) = &next {
                    st.in_window += c.len() as u64;
                }
                if pace.min_bytes_per_sec > 0 && st.window_start.elapsed() >= pace.window {
                    if st.in_window < pace.floor() {
                        return Err(Error::transient(format!(
                            "get {key}: the body came at {} bytes in {:.1}s, under the floor of {} bytes/s (min-body-bytes-per-sec): a stalled or trickling server",
                            st.in_window,
                            st.window_start.elapsed().as_secs_f64(),
                            pace.min_bytes_per_sec
                        )));
                    }
                    st.window_start = tokio::time::Instant::now();
                    st.in_window = 0;
                }
                let Some(next) = next else { continue };
                let mut chunk = match next {
                    Ok(Some(c)) => c,
                    Ok(None) => return Ok(None),
                    Err(e) => {
                        return Err(
                            Error::transient(format!("get {key}: body read failed")).with_source(e)
                        )
                    }
                };
                if st.skip > 0 {
                    let k = st.skip.min(chunk.len() as u64);
                    st.skip -= k;
                    chunk = chunk.slice(k as usize..);
                }
                if chunk.is_empty() {
                    continue;
                }
                if chunk.len() as u64 > st.take {
                    chunk = chunk.slice(..st.take as usize);
                }
                st.take -= chunk.len() as u64;
                return Ok(Some((chunk, st)));
            }
        }
    })
    .boxed()
}

/// The body of an upload from `len` bytes of the file at `path` from `offset`, streamed.
pub(super) async fn file_body(path: &std::path::Path, offset: u64, len: u64) -> Result<ByteStream> {
    ByteStream::read_from()
        .path(path)
        .offset(offset)
        .length(Length::Exact(len))
        .build()
        .await
        .map_err(|e| {
            Error::new(ErrorKind::Io, format!("open {} for upload", path.display())).with_source(e)
        })
}

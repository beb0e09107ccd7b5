//! An HTTP/1.1 proxy on loopback in front of a real S3 server. It understands just enough of
//! HTTP (request and response heads, `Content-Length` and chunked bodies, `HEAD`, interim 1xx
//! responses) to count requests and bytes each way, and to inject faults at request
//! boundaries, for any client: blobsnap in-process, the `blobsnap` binary, rclone, restic.
//!
//! Faults, each drawn per request from a seeded RNG with its own rate:
//! - `500 InternalError` or `503 SlowDown` answered by the proxy (the request never reaches
//!   the server), then the connection is closed;
//! - **connection reset**: the request is dropped and the client's socket closed with RST;
//! - **truncated body**: the request goes through, the response is cut after half of its
//!   body (lost whole when it has none) and the connection reset: the client cannot know
//!   whether the request took effect;
//! - **delay**: the request waits `delay` before it is forwarded.
//!
//! And quirks of odd servers and proxies, on every GET while set ([`Quirks`]): response
//! bodies re-framed as chunked with no `Content-Length`, response bodies trickled a few bytes
//! at a time. (A server that ignores `Range` cannot be played by a proxy — `range` is a
//! signed header — so that case is a unit test of the S3 store.)

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng as _, SeedableRng as _};
use tokio::io::{
    AsyncBufReadExt as _, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, BufReader,
};
use tokio::net::{TcpListener, TcpStream};

/// Fault rates (each in `0.0..=1.0`, drawn independently in this order; at most one fault
/// per request).
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultRates {
    pub error_500: f64,
    pub slow_down_503: f64,
    pub reset: f64,
    pub truncate: f64,
    pub delay: f64,
    pub delay_for: Duration,
    /// Only requests whose request line contains all of these are eligible.
    pub only: &'static [&'static str],
    /// At most this many faults in all (0: no limit).
    pub limit: u64,
}

impl FaultRates {
    /// `total` spread evenly over the five faults, with a 2 s delay.
    pub fn even(total: f64) -> Self {
        let each = total / 5.0;
        FaultRates {
            error_500: each,
            slow_down_503: each,
            reset: each,
            truncate: each,
            delay: each,
            delay_for: Duration::from_secs(2),
            only: &[],
            limit: 0,
        }
    }
}

/// Behaviours of odd servers and proxies, applied to every request while set.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quirks {
    /// Send GET response bodies chunked, without `Content-Length`.
    pub chunked: bool,
    /// Send GET response bodies `n` bytes at a time, every `interval`.
    pub trickle: Option<(usize, Duration)>,
    /// Answer a HEAD of a missing key `403 Forbidden` instead of `404 Not Found`, as AWS does
    /// to credentials without `s3:ListBucket`.
    pub denied_not_found: bool,
}

/// What went through the proxy.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub requests: AtomicU64,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
    pub connections: AtomicU64,
    pub injected_500: AtomicU64,
    pub injected_503: AtomicU64,
    pub resets: AtomicU64,
    pub truncated: AtomicU64,
    pub delayed: AtomicU64,
}

impl ProxyStats {
    pub fn injected(&self) -> u64 {
        self.injected_500.load(Relaxed)
            + self.injected_503.load(Relaxed)
            + self.resets.load(Relaxed)
            + self.truncated.load(Relaxed)
            + self.delayed.load(Relaxed)
    }

    /// (requests, bytes up, bytes down) now.
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.requests.load(Relaxed),
            self.bytes_up.load(Relaxed),
            self.bytes_down.load(Relaxed),
        )
    }
}

/// A running proxy; it stops when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    pub stats: Arc<ProxyStats>,
    rates: Arc<Mutex<FaultRates>>,
    quirks: Arc<Mutex<Quirks>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

enum Fault {
    None,
    E500,
    E503,
    Reset,
    Truncate,
    Delay(Duration),
}

impl Proxy {
    /// Listen on an ephemeral loopback port and forward to `upstream`.
    pub async fn start(upstream: SocketAddr, rates: FaultRates, seed: u64) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(ProxyStats::default());
        let rates = Arc::new(Mutex::new(rates));
        let quirks = Arc::new(Mutex::new(Quirks::default()));
        let rng = Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)));
        let (s, r, q) = (Arc::clone(&stats), Arc::clone(&rates), Arc::clone(&quirks));
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                s.connections.fetch_add(1, Relaxed);
                let (s, r, q, rng) = (
                    Arc::clone(&s),
                    Arc::clone(&r),
                    Arc::clone(&q),
                    Arc::clone(&rng),
                );
                tokio::spawn(async move {
                    let _ = connection(client, upstream, s, r, q, rng).await;
                });
            }
        });
        Proxy {
            addr,
            stats,
            rates,
            quirks,
            task,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_rates(&self, rates: FaultRates) {
        *self.rates.lock().unwrap() = rates;
    }

    pub fn set_quirks(&self, quirks: Quirks) {
        *self.quirks.lock().unwrap() = quirks;
    }
}

/// Body framing of a message.
#[derive(Clone, Copy, Debug)]
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

struct Head {
    raw: Vec<u8>,
    first_line: String,
    framing: Framing,
    expect_continue: bool,
}

/// Read one message head; `None` at a clean EOF before any byte.
async fn read_head<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    is_request: bool,
) -> std::io::Result<Option<Head>> {
    let mut raw = Vec::new();
    let mut first_line = String::new();
    let mut length = None;
    let mut chunked = false;
    let mut expect_continue = false;
    loop {
        let mut line = Vec::new();
        let n = r.read_until(b'\n', &mut line).await?;
        if n == 0 {
            if raw.is_empty() {
                return Ok(None);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        raw.extend_from_slice(&line);
        if raw.len() > 64 << 10 {
            return Err(std::io::Error::other("head too large"));
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        if first_line.is_empty() {
            if text.is_empty() {
                continue; // stray CRLF between messages
            }
            first_line = text;
            continue;
        }
        if text.is_empty() {
            break;
        }
        if let Some((name, value)) = text.split_once(':') {
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
            match name.as_str() {
                "content-length" => length = value.parse::<u64>().ok(),
                "transfer-encoding" if value.to_ascii_lowercase().contains("chunked") => {
                    chunked = true
                }
                "expect" if value.eq_ignore_ascii_case("100-continue") => expect_continue = true,
                _ => {}
            }
        }
    }
    let framing = if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else if is_request {
        Framing::Length(0)
    } else {
        Framing::UntilClose
    };
    Ok(Some(Head {
        raw,
        first_line,
        framing,
        expect_continue,
    }))
}

/// Copy a body of `framing` from `r` to `w` (to nowhere when `w` is `None`); stop after
/// `limit` body bytes if given. Returns the bytes written.
async fn copy_body<R, W>(
    r: &mut R,
    mut w: Option<&mut W>,
    framing: Framing,
    limit: Option<u64>,
) -> std::io::Result<u64>
where
    R: tokio::io::AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut written = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    match framing {
        Framing::Length(n) => {
            let mut left = limit.map_or(n, |l| l.min(n));
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let k = r.read(&mut buf[..want]).await?;
                if k == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                if let Some(w) = w.as_deref_mut() {
                    w.write_all(&buf[..k]).await?;
                }
                written += k as u64;
                left -= k as u64;
            }
        }
        Framing::UntilClose => loop {
            let k = r.read(&mut buf).await?;
            if k == 0 {
                break;
            }
            if let Some(w) = w.as_deref_mut() {
                w.write_all(&buf[..k]).await?;
            }
            written += k as u64;
            if limit.is_some_and(|l| written >= l) {
                break;
            }
        },
        Framing::Chunked => loop {
            let mut line = Vec::new();
            if r.read_until(b'\n', &mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if let Some(w) = w.as_deref_mut() {
                w.write_all(&line).await?;
            }
            written += line.len() as u64;
            let text = String::from_utf8_lossy(&line);
            let size_hex = text
                .trim()
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            let size = u64::from_str_radix(&size_hex, 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {size_hex:?}")))?;
            if size == 0 {
                // Trailers, then an empty line.
                loop {
                    let mut t = Vec::new();
                    if r.read_until(b'\n', &mut t).await? == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    if let Some(w) = w.as_deref_mut() {
                        w.write_all(&t).await?;
                    }
                    written += t.len() as u64;
                    if t == b"\r\n" || t == b"\n" {
                        break;
                    }
                }
                break;
            }
            let mut left = size + 2; // data + CRLF
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let k = r.read(&mut buf[..want]).await?;
                if k == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                if let Some(w) = w.as_deref_mut() {
                    w.write_all(&buf[..k]).await?;
                }
                written += k as u64;
                left -= k as u64;
            }
            if limit.is_some_and(|l| written >= l) {
                break;
            }
        },
    }
    Ok(written)
}

/// Counts bytes written through it.
struct Counted<W> {
    inner: W,
    counter: Arc<ProxyStats>,
    up: bool,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Counted<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            let c = if self.up {
                &self.counter.bytes_up
            } else {
                &self.counter.bytes_down
            };
            c.fetch_add(*n as u64, Relaxed);
        }
        r
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What the response pump must do with the response to the request just forwarded.
struct Pending {
    head_request: bool,
    truncate: bool,
    /// Quirks for this request's response (GET only).
    quirks: Quirks,
}

/// A message head without the header lines named in `drop` (lower case), with `add` lines
/// appended.
fn rewrite_head(raw: &[u8], drop: &[&str], add: &[&str]) -> Vec<u8> {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        let name = line
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if line.trim().is_empty() {
            for a in add {
                out.push_str(a);
                out.push_str("\r\n");
            }
            out.push_str(line);
            continue;
        }
        if line.contains(':') && drop.contains(&name.as_str()) {
            continue;
        }
        out.push_str(line);
    }
    out.into_bytes()
}

/// Copy a body of `n` bytes re-framed per `quirks` (chunked and/or trickled).
async fn copy_quirky<R, W>(r: &mut R, w: &mut W, n: u64, quirks: Quirks) -> std::io::Result<()>
where
    R: tokio::io::AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let step = quirks.trickle.map_or(64 << 10, |(k, _)| k.max(1));
    let mut buf = vec![0u8; step];
    let mut left = n;
    while left > 0 {
        let want = left.min(step as u64) as usize;
        let k = r.read(&mut buf[..want]).await?;
        if k == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if quirks.chunked {
            w.write_all(format!("{k:x}\r\n").as_bytes()).await?;
            w.write_all(&buf[..k]).await?;
            w.write_all(b"\r\n").await?;
        } else {
            w.write_all(&buf[..k]).await?;
        }
        left -= k as u64;
        if let Some((_, every)) = quirks.trickle {
            w.flush().await?;
            tokio::time::sleep(every).await;
        }
    }
    if quirks.chunked {
        w.write_all(b"0\r\n\r\n").await?;
    }
    Ok(())
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    stats: Arc<ProxyStats>,
    rates: Arc<Mutex<FaultRates>>,
    quirks: Arc<Mutex<Quirks>>,
    rng: Arc<Mutex<rand::rngs::StdRng>>,
) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    let client_std = client.into_std()?;
    let linger_handle = client_std.try_clone()?;
    let client = TcpStream::from_std(client_std)?;
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let mut cr = BufReader::new(cr);
    let mut sw = Counted {
        inner: sw,
        counter: Arc::clone(&stats),
        up: true,
    };
    let cw = Arc::new(tokio::sync::Mutex::new(Counted {
        inner: cw,
        counter: Arc::clone(&stats),
        up: false,
    }));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Pending>();
    let linger_handle = Arc::new(linger_handle);
    let truncated = Arc::new(tokio::sync::Notify::new());

    // Responses: server -> client.
    let pump = {
        let cw = Arc::clone(&cw);
        let linger = Arc::clone(&linger_handle);
        let stats = Arc::clone(&stats);
        let truncated = Arc::clone(&truncated);
        tokio::spawn(async move {
            let mut sr = BufReader::new(sr);
            while let Some(p) = rx.recv().await {
                loop {
                    let Ok(Some(head)) = read_head(&mut sr, false).await else {
                        let _ = cw.lock().await.shutdown().await;
                        return;
                    };
                    let status: u16 = head
                        .first_line
                        .split_whitespace()
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    let mut w = cw.lock().await;
                    let framing = if p.head_request || status == 204 || status == 304 {
                        Framing::Length(0)
                    } else {
                        head.framing
                    };
                    let empty = matches!(framing, Framing::Length(0));
                    if p.truncate && empty && !(100..200).contains(&status) {
                        // No body to cut: the whole response is lost (the request was
                        // carried out: an ambiguous outcome for the client).
                        stats.truncated.fetch_add(1, Relaxed);
                        let _ = socket2::SockRef::from(&*linger).set_linger(Some(Duration::ZERO));
                        truncated.notify_one();
                        return;
                    }
                    let quirky = (p.quirks.chunked || p.quirks.trickle.is_some())
                        && !p.truncate
                        && (200..300).contains(&status);
                    if let (true, Framing::Length(n)) = (quirky, framing) {
                        let raw = if p.quirks.chunked {
                            rewrite_head(
                                &head.raw,
                                &["content-length"],
                                &["Transfer-Encoding: chunked"],
                            )
                        } else {
                            head.raw.clone()
                        };
                        if w.write_all(&raw).await.is_err()
                            || copy_quirky(&mut sr, &mut *w, n, p.quirks).await.is_err()
                        {
                            let _ = w.shutdown().await;
                            return;
                        }
                        let _ = w.flush().await;
                        break;
                    }
                    let raw = if p.quirks.denied_not_found && p.head_request && status == 404 {
                        let text = String::from_utf8_lossy(&head.raw).into_owned();
                        text.replacen(&head.first_line, "HTTP/1.1 403 Forbidden", 1)
                            .into_bytes()
                    } else {
                        head.raw.clone()
                    };
                    if w.write_all(&raw).await.is_err() {
                        return;
                    }
                    if (100..200).contains(&status) {
                        continue; // interim: the final response follows
                    }
                    if p.truncate {
                        let cut = match framing {
                            Framing::Length(n) => Some(n / 2),
                            _ => Some(1024),
                        };
                        let _ = copy_body(&mut sr, Some(&mut *w), framing, cut).await;
                        let _ = w.flush().await;
                        stats.truncated.fetch_add(1, Relaxed);
                        // Closed with RST once every handle is dropped.
                        let _ = socket2::SockRef::from(&*linger).set_linger(Some(Duration::ZERO));
                        truncated.notify_one();
                        return;
                    }
                    if copy_body(&mut sr, Some(&mut *w), framing, None)
                        .await
                        .is_err()
                    {
                        let _ = w.shutdown().await;
                        return;
                    }
                    let _ = w.flush().await;
                    break;
                }
            }
        })
    };

    // Requests: client -> server.
    let requests = async {
        while let Some(head) = read_head(&mut cr, true).await? {
            stats.requests.fetch_add(1, Relaxed);
            let fault = {
                let r = *rates.lock().unwrap();
                let eligible = r.only.iter().all(|w| head.first_line.contains(w))
                    && (r.limit == 0 || stats.injected() < r.limit);
                let mut rng = rng.lock().unwrap();
                let x: f64 = rng.random();
                let mut acc = 0.0;
                let mut pick = Fault::None;
                for (rate, f) in [
                    (r.error_500, Fault::E500),
                    (r.slow_down_503, Fault::E503),
                    (r.reset, Fault::Reset),
                    (r.truncate, Fault::Truncate),
                    (r.delay, Fault::Delay(r.delay_for)),
                ] {
                    acc += rate;
                    if eligible && x < acc {
                        pick = f;
                        break;
                    }
                }
                pick
            };
            let is_head = head.first_line.starts_with("HEAD ");
            match fault {
                Fault::E500 | Fault::E503 => {
                    if !head.expect_continue {
                        copy_body(&mut cr, None::<&mut tokio::io::Sink>, head.framing, None)
                            .await?;
                    }
                    let (status, code, counter) = if matches!(fault, Fault::E500) {
                        (
                            "500 Internal Server Error",
                            "InternalError",
                            &stats.injected_500,
                        )
                    } else {
                        ("503 Slow Down", "SlowDown", &stats.injected_503)
                    };
                    counter.fetch_add(1, Relaxed);
                    let body = format!(
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>injected by the test proxy</Message></Error>"
                    );
                    let body = if is_head { String::new() } else { body };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        if is_head { 0 } else { body.len() }
                    );
                    let mut w = cw.lock().await;
                    w.write_all(resp.as_bytes()).await?;
                    w.flush().await?;
                    w.shutdown().await?;
                    return Ok(());
                }
                Fault::Reset => {
                    stats.resets.fetch_add(1, Relaxed);
                    // Closed with RST once every handle is dropped.
                    socket2::SockRef::from(&*linger_handle).set_linger(Some(Duration::ZERO))?;
                    return Err(std::io::Error::other("reset injected"));
                }
                Fault::Delay(d) => {
                    stats.delayed.fetch_add(1, Relaxed);
                    tokio::time::sleep(d).await;
                }
                Fault::Truncate | Fault::None => {}
            }
            let q = *quirks.lock().unwrap();
            let is_get = head.first_line.starts_with("GET ");
            let _ = tx.send(Pending {
                head_request: is_head,
                truncate: matches!(fault, Fault::Truncate),
                quirks: match (is_get, is_head) {
                    (true, _) => q,
                    (_, true) => Quirks {
                        denied_not_found: q.denied_not_found,
                        ..Quirks::default()
                    },
                    _ => Quirks::default(),
                },
            });
            sw.write_all(&head.raw).await?;
            copy_body(&mut cr, Some(&mut sw), head.framing, None).await?;
            sw.flush().await?;
        }
        Ok::<(), std::io::Error>(())
    };
    let result = tokio::select! {
        r = requests => r,
        _ = truncated.notified() => Err(std::io::Error::other("response truncated")),
    };
    drop(tx);
    if result.is_err() {
        pump.abort();
        let _ = pump.await;
    } else {
        let _ = pump.await;
    }
    drop(linger_handle);
    result
}

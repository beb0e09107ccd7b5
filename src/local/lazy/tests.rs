use super::fs::*;
use super::links::*;
use super::registry::*;
use super::*;
use crate::error::{Error, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

fn entry(name: &str, size: u64) -> FileIndex {
    crate::index::tests::test_file(name, size, Some(format!("blob-{name}")), None)
}

/// A fetch of `000001.sst` that never resolves, and one of `000002.sst` that writes its
/// temp file once `release` is sent; `started` gets each file's name as its fetch starts.
fn gated_fetch(
    release: tokio::sync::watch::Receiver<bool>,
    started: mpsc::Sender<String>,
) -> FetchFn {
    let started = Mutex::new(started);
    Arc::new(move |e: FileIndex, tmp: PathBuf| {
        let mut release = release.clone();
        let _ = started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .send(e.file_name.clone());
        Box::pin(async move {
            if e.file_name == "000001.sst" {
                std::future::pending::<()>().await;
            }
            let _ = release.wait_for(|r| *r).await;
            std::fs::write(&tmp, vec![7u8; e.file_metadata.size as usize])
                .map_err(Error::io_with("write"))?;
            Ok(())
        })
    })
}

/// F1 of the lazy-restore review: `close` (registry → placing → each file's state) racing
/// a fetch that finishes (it used to take its file's state, then `placing`). The test
/// holds one file's state while close runs, then lets the other file's fetch finish:
/// with the old order both sides waited for each other forever; with the module's one
/// lock order the close returns and the finished fetch places nothing.
#[test]
fn close_racing_a_finishing_fetch_returns() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    let (release_tx, started_rx) = register_gated_files(
        &dir,
        vec![entry("000001.sst", 10), entry("000002.sst", 20)],
        2,
    );
    let mut seen = vec![
        started_rx.recv_timeout(Duration::from_secs(30)).unwrap(),
        started_rx.recv_timeout(Duration::from_secs(30)).unwrap(),
    ];
    seen.sort();
    assert_eq!(seen, ["000001.sst", "000002.sst"]);
    let store = registry()
        .stores
        .get(&absolute(&dir).unwrap())
        .cloned()
        .unwrap();
    let first = Arc::clone(&store.files["000001.sst"]);
    let second = Arc::clone(&store.files["000002.sst"]);
    let held = first.state();
    let (closed_tx, closed_rx) = mpsc::channel();
    let close_dir = dir.clone();
    std::thread::spawn(move || {
        close(&close_dir);
        let _ = closed_tx.send(());
    });
    // Let the close reach the held state, then the second fetch finish (the order that
    // deadlocked; a different interleaving only makes the race easier).
    std::thread::sleep(Duration::from_millis(100));
    release_tx.send(true).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(held);
    closed_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("close returned (no lock-order deadlock)");
    // Both fetches settle (the cancel ends the pending one), nothing is placed after the
    // close, and no temp file is left.
    for r in [&first, &second] {
        let mut st = r.state();
        while *st == FileState::Fetching {
            st = r
                .changed
                .wait_timeout(st, Duration::from_secs(30))
                .unwrap()
                .0;
        }
        assert!(
            matches!(
                *st,
                FileState::Failed(ErrorKind::Cancelled, _) | FileState::Local
            ),
            "{:?}",
            *st
        );
    }
    assert!(!dir.join("000001.sst").exists());
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".blobsnap-part"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(status(&dir).is_none());
}

/// F4: a reader waiting for a fetch that never completes is woken by the close, with an
/// error, at once (the close cancels the download instead of waiting for it).
#[test]
fn close_wakes_a_reader_waiting_for_a_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    let (_release_tx, started_rx) = register_gated_files(&dir, vec![entry("000001.sst", 10)], 1);
    started_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let (tx, rx) = mpsc::channel();
    let (reading_tx, reading_rx) = mpsc::channel();
    let path = absolute(&dir).unwrap().join("000001.sst");
    std::thread::spawn(move || {
        let _ = reading_tx.send(());
        let _ = tx.send(fetch_now(&path));
    });
    // The reader is parked on the in-flight fetch (or about to be): close.
    reading_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    close(&dir);
    let r = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the reader was woken");
    let (kind, msg) = r.unwrap_err();
    assert_eq!(kind, ErrorKind::Cancelled, "{msg}");
    assert!(msg.contains("closed"), "{msg}");
}

/// A stress of the lock order: 200 cycles of register → readers fetching on 3 threads →
/// close racing them (and a new registration of the same dir replacing the last one),
/// each fetch finishing at a different moment; the whole must end within its bound (a
/// deadlock fails it instead of hanging the suite), every reader gets its file or an
/// error, and nothing is ever left Fetching.
#[test]
fn two_hundred_register_read_close_cycles_never_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let root = tmp.path().to_path_buf();
    std::thread::spawn(move || {
        for cycle in 0..200u32 {
            let dir = root.join(format!("s{}", cycle % 4));
            std::fs::create_dir_all(&dir).unwrap();
            for f in std::fs::read_dir(&dir).unwrap().flatten() {
                let _ = std::fs::remove_file(f.path());
            }
            let fetch: FetchFn = Arc::new(move |e: FileIndex, tmp: PathBuf| {
                Box::pin(async move {
                    // Finish at a different moment each time.
                    for _ in 0..(e.file_metadata.size + u64::from(cycle)) % 5 {
                        tokio::task::yield_now().await;
                    }
                    std::fs::write(&tmp, vec![1u8; e.file_metadata.size as usize])
                        .map_err(Error::io_with("write"))
                })
            });
            let names = ["000001.sst", "000002.sst", "000003.sst"];
            register(
                &dir,
                names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| entry(n, i as u64 + 1))
                    .collect(),
                fetch,
                None,
                Background {
                    downloads: 2,
                    max_rate: 0,
                },
            )
            .unwrap();
            let abs = absolute(&dir).unwrap();
            let readers: Vec<_> = names
                .iter()
                .map(|n| {
                    let p = abs.join(n);
                    std::thread::spawn(move || fetch_now(&p))
                })
                .collect();
            if cycle % 2 == 0 {
                close(&dir);
            }
            for r in readers {
                match r.join().unwrap() {
                    Ok(()) => {}
                    Err((kind, msg)) => assert_eq!(kind, ErrorKind::Cancelled, "{msg}"),
                }
            }
            close(&dir);
        }
        let _ = done_tx.send(());
    });
    done_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("200 cycles ended (no deadlock)");
    assert_eq!(
        registry()
            .stores
            .keys()
            .filter(|d| d.starts_with(tmp.path()))
            .count(),
        0
    );
}

/// A read from a current-thread runtime is refused with a clear error (it would park the
/// runtime's only thread until the download completes).
#[test]
fn a_current_thread_runtime_is_refused() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let e = rt.block_on(async { refuse_current_thread() }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("current-thread"), "{e}");
    assert!(refuse_current_thread().is_ok());
}

/// A checkpoint dir's pending list: appended per link, read back by name, and the dir is
/// refused by every other reader (naming the missing files) until they are there.
#[test]
fn a_pending_list_marks_a_dir_incomplete_and_names_the_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    append_pending(dir.path(), &entry("000007.sst", 1), true).unwrap();
    append_pending(dir.path(), &entry("000009.sst", 1), false).unwrap();
    assert_eq!(
        read_pending(dir.path()).unwrap(),
        ["000007.sst", "000009.sst"]
    );
    std::fs::write(dir.path().join("000007.sst"), b"x").unwrap();
    let e = check_complete(dir.path()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    let msg = e.to_string();
    assert!(
        msg.contains("000009.sst") && !msg.contains("000007.sst") && msg.contains("1 files"),
        "{msg}"
    );
    std::fs::write(dir.path().join(LAZY_PENDING), b"\xff not json").unwrap();
    let e = check_complete(dir.path()).unwrap_err();
    assert!(e.to_string().contains("unreadable"), "{e}");
}

fn entry_of(name: &str, bytes: &[u8]) -> FileIndex {
    let mut e = entry(name, bytes.len() as u64);
    e.sha256 = Some(crate::digest::Sha256::of(bytes));
    e
}

/// Register `dir` with one remote file fetched by [`gated_fetch`], one background
/// download at a time; the returned sender releases the fetch.
fn register_gated(dir: &Path, e: FileIndex) -> tokio::sync::watch::Sender<bool> {
    register_gated_files(dir, vec![e], 1).0
}

/// Register `dir` with the remote `files`, fetched by [`gated_fetch`], `downloads` at a
/// time: the sender releases the fetches, the receiver gets each file's name as its fetch
/// starts.
fn register_gated_files(
    dir: &Path,
    files: Vec<FileIndex>,
    downloads: usize,
) -> (tokio::sync::watch::Sender<bool>, mpsc::Receiver<String>) {
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let (started_tx, started_rx) = mpsc::channel();
    register(
        dir,
        files,
        gated_fetch(release_rx, started_tx),
        None,
        Background {
            downloads,
            max_rate: 0,
        },
    )
    .unwrap();
    (release_tx, started_rx)
}

/// Wait (on the file's condition variable, bounded) until `name` of the store at `dir` is
/// placed, then link what is placed into the checkpoint dirs that recorded it.
fn wait_placed(dir: &Path, name: &str) {
    let store = registry()
        .stores
        .get(&absolute(dir).unwrap())
        .cloned()
        .unwrap();
    let remote = Arc::clone(&store.files[name]);
    let mut st = remote.state();
    while *st != FileState::Local {
        let (next, timeout) = remote
            .changed
            .wait_timeout(st, Duration::from_secs(30))
            .unwrap();
        assert!(!timeout.timed_out(), "{name} never placed");
        st = next;
    }
    drop(st);
    materialize();
}

/// L1 of the second lazy-restore review: a file placed (and linked into a checkpoint dir)
/// between the scan's two looks at that dir — the walk and the list of its remote files —
/// is in the scan. The list is read first: a file it lacks was linked on disk before the
/// walk. Read after the walk, a file placed between is in neither, and the commit's index
/// lacks a table its MANIFEST names.
#[test]
fn a_file_placed_while_a_checkpoint_is_scanned_is_in_the_scan() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    let release_tx = register_gated(&dir, entry_of("000002.sst", &[7u8; 20]));
    let (cp_tmp, cp) = (tmp.path().join("cp.tmp"), tmp.path().join("cp"));
    std::fs::create_dir(&cp_tmp).unwrap();
    assert!(link(&dir.join("000002.sst"), &cp_tmp.join("000002.sst")));
    std::fs::rename(&cp_tmp, &cp).unwrap();
    renamed(&cp_tmp, &cp);
    assert_eq!(remote_files_in(&cp).len(), 1);
    let hook_dir = dir.clone();
    crate::crash::TEST_HOOK.with(|h| {
        *h.borrow_mut() = Some((
            "scan.between-remote-list-and-walk",
            Box::new(move || {
                release_tx.send(true).unwrap();
                wait_placed(&hook_dir, "000002.sst");
            }),
        ))
    });
    let scanned = crate::local::scan::scan_dir_only(
        &cp,
        None,
        None,
        &crate::local::scan::Owners::default(),
        &crate::local::scan::ScanStats::default(),
    );
    crate::crash::TEST_HOOK.with(|h| *h.borrow_mut() = None);
    let scanned = scanned.unwrap();
    assert!(cp.join("000002.sst").exists(), "placed during the scan");
    let names: Vec<_> = scanned.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["000002.sst"],
        "the scan lost the file placed meanwhile"
    );
    close(&dir);
}

/// L2 of the second lazy-restore review: a store's first link into a new checkpoint dir
/// must not forget another checkpoint's records while that one is between RocksDB's
/// rename of its `.tmp` dir and the rename's callback.
#[test]
fn a_checkpoint_renamed_while_another_links_keeps_its_remote_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    // 000001.sst's fetch never resolves: the file stays remote.
    let _release = register_gated(&dir, entry_of("000001.sst", &[1u8; 10]));
    let src = dir.join("000001.sst");
    let (a_tmp, a, b_tmp) = (
        tmp.path().join("a.tmp"),
        tmp.path().join("a"),
        tmp.path().join("b.tmp"),
    );
    std::fs::create_dir(&a_tmp).unwrap();
    std::fs::create_dir(&b_tmp).unwrap();
    assert!(link(&src, &a_tmp.join("000001.sst")));
    std::fs::rename(&a_tmp, &a).unwrap();
    assert!(link(&src, &b_tmp.join("000001.sst")));
    renamed(&a_tmp, &a);
    let names: Vec<_> = remote_files_in(&a).into_iter().map(|(n, ..)| n).collect();
    assert_eq!(names, ["000001.sst"], "checkpoint a lost its remote file");
    close(&dir);
}

/// Two lazily restored stores checkpointing at once, 200 times (issue 46's lazy suite): each
/// round both link their remote table into a new `.tmp` dir, rename it and report the rename
/// at the same moment (a barrier between each step), and each checkpoint then lists its
/// remote file — the records one store's links make never cost the other its own (L2), in
/// any order the two threads take.
#[test]
fn two_lazy_stores_checkpointing_at_once_keep_every_remote_file() {
    let tmp = tempfile::tempdir().unwrap();
    let stores: Vec<(PathBuf, tokio::sync::watch::Sender<bool>)> = ["a", "b"]
        .iter()
        .map(|s| {
            let dir = tmp.path().join(s);
            std::fs::create_dir(&dir).unwrap();
            let gate = register_gated(&dir, entry_of("000001.sst", &[3u8; 10]));
            (dir, gate)
        })
        .collect();
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for (i, (dir, _)) in stores.iter().enumerate() {
            let (barrier, root) = (&barrier, tmp.path());
            s.spawn(move || {
                for round in 0..200 {
                    let cp = root.join(format!("cp-{i}-{round}"));
                    let cp_tmp = root.join(format!("cp-{i}-{round}.tmp"));
                    std::fs::create_dir(&cp_tmp).unwrap();
                    barrier.wait();
                    assert!(link(&dir.join("000001.sst"), &cp_tmp.join("000001.sst")));
                    barrier.wait();
                    std::fs::rename(&cp_tmp, &cp).unwrap();
                    barrier.wait();
                    renamed(&cp_tmp, &cp);
                    barrier.wait();
                    let names: Vec<_> = remote_files_in(&cp).into_iter().map(|(n, ..)| n).collect();
                    assert_eq!(names, ["000001.sst"], "store {i} round {round}");
                    // The commit manager deletes the checkpoint dir before the next.
                    std::fs::remove_dir_all(&cp).unwrap();
                }
            });
        }
    });
    for (dir, _) in &stores {
        close(dir);
    }
}

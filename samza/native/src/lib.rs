//! blobsnap's engine behind Apache Samza's state-backend SPI, through JNI (issue 50, route 1;
//! docs/samza.md). The Java side is `samza/src/main/java/blobsnap` (`blobsnap.Native` declares
//! every entry point below); this library is blobsnap's own backup, restore and checkpoint
//! code, driven by Samza's commit manager instead of blobsnap's runtime.
//!
//! Threads and lifetimes:
//!
//! - one tokio runtime per JVM ([`runtime`]), two workers named `blobsnap-jni-N`, attached to
//!   the JVM as daemons when they start; a synchronous entry point runs its async work with
//!   `block_on` on the *Java* caller's thread — never on a runtime worker (refused);
//! - an asynchronous entry point takes a raw `CompletableFuture` and a worker completes it;
//!   the Java side hands the caller another future, completed from Samza's executor, so that
//!   Samza's dependent stages never run on a runtime worker;
//! - a handle is an id in one table ([`TABLE`]), never a pointer: a call with a closed or
//!   unknown id fails with "closed", a close racing a call leaves the call its `Arc`;
//!   `close` removes the id, cancels the handle's work in flight and waits for it (bounded);
//! - every entry point runs under `catch_unwind`: an error or a panic becomes a Java
//!   `blobsnap.BlobsnapException` carrying blobsnap's error kind and message, thrown on the
//!   caller's thread or completing the future exceptionally — never an abort of the JVM.
//!
//! No `unsafe` here: the jni crate's calls are safe, and handles are table ids. The library
//! installs no signal handler (nothing here calls `tokio::signal`).

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use blobsnap::backend::{
    StateBackendFactory, StoreMarkers, StoreSpec, SystemClock, TaskBackupManager, TaskContext,
    TaskRestoreManager,
};
use blobsnap::blob::backup::BackupSettings;
use blobsnap::blob::factory::BlobStateBackendFactory;
use blobsnap::blob::prepared;
use blobsnap::blob::restore::RestoreSettings;
use blobsnap::blob::snapshot::FACTORY_NAME;
use blobsnap::checkpoint::{BlobCheckpointStore, Checkpoint, CheckpointId, CheckpointStore};
use blobsnap::commit::TaskCommitManager;
use blobsnap::config::Settings;
use blobsnap::job::{start_task_from, StartFrom};
use blobsnap::layout::JobScope;
use blobsnap::{Error, ErrorKind};
use jni::objects::{GlobalRef, JByteArray, JClass, JObject, JObjectArray, JString, JValue};
use jni::sys::{jboolean, jbyteArray, jlong, jobjectArray};
use jni::{JNIEnv, JavaVM};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The Java exception every failure becomes: `BlobsnapException(String kind, String message)`.
const EXCEPTION_CLASS: &str = "blobsnap/BlobsnapException";

/// How long `close` waits for a handle's work in flight once it is cancelled.
const CLOSE_WAIT: Duration = Duration::from_secs(30);

/// A failure as Java sees it: blobsnap's error kind (`transient`, `corrupt`, …) and message.
#[derive(Debug)]
struct Fail {
    kind: &'static str,
    msg: String,
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail {
            kind: e.kind().as_str(),
            msg: e.to_string(),
        }
    }
}

impl From<jni::errors::Error> for Fail {
    fn from(e: jni::errors::Error) -> Self {
        Fail {
            kind: "invalid-input",
            msg: format!("JNI: {e}"),
        }
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidInput, msg)
}

fn fail(kind: ErrorKind, msg: impl Into<String>) -> Fail {
    Fail {
        kind: kind.as_str(),
        msg: msg.into(),
    }
}

type R<T> = std::result::Result<T, Fail>;

// ----- the runtime, the JVM, the exception class -----

static VM: OnceLock<JavaVM> = OnceLock::new();
static EXCEPTION: OnceLock<GlobalRef> = OnceLock::new();
static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// The JVM's one runtime, made at the first call (`Native.init`, on a Java thread).
fn runtime() -> R<&'static tokio::runtime::Runtime> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name_fn(move || format!("blobsnap-jni-{}", next.fetch_add(1, Ordering::Relaxed)))
        .on_thread_start(attach_named)
        .enable_all()
        .build()
        .map_err(|e| {
            fail(
                ErrorKind::Io,
                format!("cannot start the async runtime: {e}"),
            )
        })?;
    // A racing first call built one too: keep the first, drop ours (on this Java thread).
    let _ = RUNTIME.set(rt);
    RUNTIME
        .get()
        .ok_or_else(|| fail(ErrorKind::Io, "the async runtime vanished"))
}

/// Runs `work` to its end on the runtime from a Java thread. Refused on a runtime worker (a
/// Java callback that came back in on one would deadlock the runtime).
fn block_on<T>(work: impl Future<Output = R<T>>) -> R<T> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(fail(
            ErrorKind::InvalidInput,
            "a blocking blobsnap call was made on blobsnap's own runtime thread (a callback that calls back in must hand off to an executor)",
        ));
    }
    runtime()?.block_on(work)
}

/// Attaches a runtime worker to the JVM when it starts, as a daemon, named as the Rust thread
/// (the jni crate detaches it when the thread exits).
fn attach_named() {
    let Some(vm) = VM.get() else { return };
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<(), jni::errors::Error> {
        let mut env = vm.attach_current_thread_as_daemon()?;
        let name = std::thread::current()
            .name()
            .unwrap_or("blobsnap-jni")
            .to_string();
        env.with_local_frame(4, |env| -> Result<(), jni::errors::Error> {
            let jname = env.new_string(&name)?;
            let thread = env
                .call_static_method(
                    "java/lang/Thread",
                    "currentThread",
                    "()Ljava/lang/Thread;",
                    &[],
                )?
                .l()?;
            env.call_method(
                &thread,
                "setName",
                "(Ljava/lang/String;)V",
                &[JValue::Object(&jname)],
            )?;
            Ok(())
        })
    }));
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot attach a runtime thread to the JVM"),
        Err(p) => tracing::warn!("{}", panic_message(&*p)),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned());
    match what {
        Some(s) => format!("panic in blobsnap's native code: {s}"),
        None => "panic in blobsnap's native code".to_string(),
    }
}

/// A `BlobsnapException(kind, msg)`, as a local reference.
fn exception<'a>(env: &mut JNIEnv<'a>, f: &Fail) -> Result<JObject<'a>, jni::errors::Error> {
    let kind = env.new_string(f.kind)?;
    let msg = env.new_string(&f.msg)?;
    match EXCEPTION.get() {
        Some(class) => {
            let class: &JClass = class.as_obj().into();
            env.new_object(
                class,
                "(Ljava/lang/String;Ljava/lang/String;)V",
                &[JValue::Object(&kind), JValue::Object(&msg)],
            )
        }
        None => env.new_object(
            EXCEPTION_CLASS,
            "(Ljava/lang/String;Ljava/lang/String;)V",
            &[JValue::Object(&kind), JValue::Object(&msg)],
        ),
    }
}

/// Throws `f` on the calling Java thread (pending when the native method returns).
fn throw(env: &mut JNIEnv, f: &Fail) {
    if env.exception_check().unwrap_or(false) {
        return; // a Java exception is already pending: keep it
    }
    match exception(env, f) {
        Ok(ex) => {
            let _ = env.throw(jni::objects::JThrowable::from(ex));
        }
        Err(_) => {
            let _ = env.throw_new("java/lang/RuntimeException", &f.msg);
        }
    }
}

/// The body of every entry point: an `Err` or a panic becomes a pending Java exception and
/// `default` is returned.
fn entry<'l, T>(env: &mut JNIEnv<'l>, default: T, body: impl FnOnce(&mut JNIEnv<'l>) -> R<T>) -> T {
    match catch_unwind(AssertUnwindSafe(|| body(env))) {
        Ok(Ok(v)) => v,
        Ok(Err(f)) => {
            throw(env, &f);
            default
        }
        Err(p) => {
            throw(env, &fail(ErrorKind::Permanent, panic_message(&*p)));
            default
        }
    }
}

// ----- the handle table -----

/// What an async entry point completes its future with.
enum Value {
    Void,
    Strings(Vec<String>),
}

/// Work of one handle that `close` cancels and waits for.
///
/// A close racing a call: `spawn_op` starts work only under `state`'s lock and only while the
/// handle is open; `drain` marks it closed and cancels under the same lock, then waits. So
/// every op is either started before the close (tracked, cancelled, waited for) or refused
/// ("closed"): none runs on a closed manager. The lock is never held across an await.
struct Ops {
    state: Mutex<OpsState>,
    tracker: TaskTracker,
}

struct OpsState {
    cancel: CancellationToken,
    closed: bool,
}

impl Ops {
    fn new() -> Self {
        Ops {
            state: Mutex::new(OpsState {
                cancel: CancellationToken::new(),
                closed: false,
            }),
            tracker: TaskTracker::new(),
        }
    }

    fn state(&self) -> R<std::sync::MutexGuard<'_, OpsState>> {
        self.state
            .lock()
            .map_err(|_| fail(ErrorKind::Io, "handle lock poisoned"))
    }

    /// Cancels the work in flight; later calls get a fresh token.
    fn cancel(&self) -> R<()> {
        let mut st = self.state()?;
        st.cancel.cancel();
        st.cancel = CancellationToken::new();
        Ok(())
    }

    /// Marks the handle closed, cancels what is in flight and waits for it to end (bounded).
    async fn drain(&self) {
        if let Ok(mut st) = self.state() {
            st.closed = true;
            st.cancel.cancel();
        }
        self.tracker.close();
        if tokio::time::timeout(CLOSE_WAIT, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "blobsnap: work of a closed handle did not end within {} s of its cancel",
                CLOSE_WAIT.as_secs()
            );
        }
    }
}

struct Engine {
    settings: Settings,
    factory: BlobStateBackendFactory,
    store: Arc<dyn blobsnap::blobstore::BlobStore>,
}

/// A manager behind a handle, with its work in flight.
struct Managed<M: ?Sized> {
    manager: Arc<M>,
    ops: Ops,
}

impl<M: ?Sized> Managed<M> {
    fn new(manager: Arc<M>) -> Arc<Self> {
        Arc::new(Managed {
            manager,
            ops: Ops::new(),
        })
    }
}

type Restore = Managed<dyn TaskRestoreManager>;

/// A backup manager behind a handle, with its work in flight, and its prepared history when
/// the job's checkpoints are not blobsnap's.
struct Backup {
    manager: Arc<dyn TaskBackupManager>,
    ops: Ops,
    history: Option<History>,
}

/// Under another checkpoint manager (Kafka's), blobsnap's bucket holds no commit point: each
/// upload leaves a *prepared* history record (a root for the sweep) and Samza's checkpoint,
/// once written, is committed into blobsnap's own history — at `cleanUp`, or by the next
/// start's `init`, which gets it back from Samza (Samza 1.8.0 never calls `cleanUp` for the
/// checkpoint it restarts from) — so that the sweep, `checkpoints`, savepoints and restores
/// see it. The start also drops the records of commits Samza never wrote (docs/samza.md).
struct History {
    store: Arc<dyn blobsnap::blobstore::BlobStore>,
    job: JobScope,
    ctx: TaskContext,
    settings: blobsnap::config::JobConfig,
    /// The task's history, claimed at `init`.
    commits: OnceLock<TaskCommitManager>,
}

impl History {
    fn commits(&self) -> R<&TaskCommitManager> {
        self.commits.get().ok_or_else(|| {
            fail(
                ErrorKind::InvalidInput,
                "the backup manager was not initialised (Samza calls init before any commit)",
            )
        })
    }

    /// `init`: claim the task's history, commit Samza's last checkpoint into it (unless it is
    /// already there), and drop the task's prepared records up to its id: that one is committed
    /// now, the older ones' commits never happened or are superseded. A newer one may be a
    /// zombie container's commit in flight: it stays a root until a later promotion passes it.
    async fn start(&self, last: Option<&Checkpoint>) -> R<()> {
        let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
            Arc::clone(&self.store),
            self.job.clone(),
        ));
        let (commits, _claim) = TaskCommitManager::start(
            self.ctx.clone(),
            checkpoints,
            Arc::new(SystemClock),
            self.settings.retention.last.max(1),
            self.settings.unsafe_no_fencing,
        )
        .await?;
        let commits = commits.with_retention_tiers(self.settings.retention.tiers.clone());
        if let Some(cp) = last.and_then(Checkpoint::as_v2) {
            if cp.state_checkpoint_markers.contains_key(FACTORY_NAME) {
                promote_into(&commits, cp.clone()).await?;
            }
            self.drop_records_up_to(cp.id).await?;
        }
        self.commits.set(commits).map_err(|_| {
            fail(
                ErrorKind::InvalidInput,
                "the backup manager's init was called twice",
            )
        })
    }

    /// The end of `upload`: the prepared record of the checkpoint Samza is about to write.
    async fn prepare(&self, id: CheckpointId, markers: &StoreMarkers) -> R<()> {
        self.commits()?;
        let cp = blobsnap::checkpoint::CheckpointV2 {
            id,
            input_offsets: BTreeMap::new(),
            state_checkpoint_markers: BTreeMap::from([(FACTORY_NAME.to_string(), markers.clone())]),
        };
        Ok(prepared::write(self.store.as_ref(), &self.job, &self.ctx.task_name, &cp).await?)
    }

    /// `cleanUp`: Samza wrote checkpoint `id`: commit it into blobsnap's history (its offsets
    /// are Samza's, not handed to `cleanUp`), then drop its prepared record.
    async fn promote(&self, id: CheckpointId, markers: &StoreMarkers) -> R<()> {
        let cp = blobsnap::checkpoint::CheckpointV2 {
            id,
            input_offsets: BTreeMap::new(),
            state_checkpoint_markers: BTreeMap::from([(FACTORY_NAME.to_string(), markers.clone())]),
        };
        promote_into(self.commits()?, cp).await?;
        self.drop_records_up_to(id).await
    }

    /// Delete the task's prepared records of checkpoints up to `id` (Samza's ids order by its
    /// clock: a record of a later id is left, see `start`).
    async fn drop_records_up_to(&self, id: CheckpointId) -> R<()> {
        let records =
            prepared::list(self.store.as_ref(), &self.job, Some(&self.ctx.task_name)).await?;
        let keys: Vec<_> = records
            .into_iter()
            .filter(|p| p.id <= id)
            .map(|p| p.key)
            .collect();
        if keys.len() > 1 {
            tracing::info!(task = %self.ctx.task_name, records = keys.len(), "dropping the prepared history records of commits Samza did not write or that are superseded");
        }
        Ok(prepared::remove(self.store.as_ref(), &keys).await?)
    }
}

/// Commit `cp` into the history unless it is its head already.
async fn promote_into(
    commits: &TaskCommitManager,
    cp: blobsnap::checkpoint::CheckpointV2,
) -> R<()> {
    let head = commits.last().await;
    if head.as_ref().and_then(Checkpoint::as_v2).map(|c| c.id) != Some(cp.id) {
        commits.commit_made(cp).await?;
    }
    Ok(())
}

struct TaskCheckpoints {
    commits: TaskCommitManager,
    /// The checkpoint the task had before this process claimed it (`None`: a new task).
    previous: Option<Checkpoint>,
}

#[derive(Clone)]
enum Entry {
    Engine(Arc<Engine>),
    Backup(Arc<Backup>),
    Restore(Arc<Restore>),
    Task(Arc<TaskCheckpoints>),
}

struct Table {
    next: jlong,
    map: BTreeMap<jlong, Entry>,
}

/// Every live handle. Lock order: `TABLE`, then `ENGINES`; a handle's `Ops::state` is taken
/// alone (after its `Arc` left the table's lock). None is held across an await or a call
/// into Java.
static TABLE: Mutex<Table> = Mutex::new(Table {
    next: 0,
    map: BTreeMap::new(),
});

/// Engines by their settings: every task of a JVM with the same settings shares one store
/// handle and its one transfer budget.
static ENGINES: Mutex<BTreeMap<String, Arc<Engine>>> = Mutex::new(BTreeMap::new());

fn table() -> R<std::sync::MutexGuard<'static, Table>> {
    TABLE
        .lock()
        .map_err(|_| fail(ErrorKind::Io, "blobsnap's handle table lock poisoned"))
}

fn insert(e: Entry) -> R<jlong> {
    let mut t = table()?;
    t.next += 1;
    let id = t.next;
    t.map.insert(id, e);
    Ok(id)
}

fn get(h: jlong) -> R<Entry> {
    table()?.map.get(&h).cloned().ok_or_else(|| {
        fail(
            ErrorKind::InvalidInput,
            format!("blobsnap handle {h} is closed (or was never opened): the object was used after close()"),
        )
    })
}

fn engine(h: jlong) -> R<Arc<Engine>> {
    match get(h)? {
        Entry::Engine(e) => Ok(e),
        _ => Err(fail(
            ErrorKind::InvalidInput,
            format!("handle {h} is not an engine"),
        )),
    }
}

fn backup(h: jlong) -> R<Arc<Backup>> {
    match get(h)? {
        Entry::Backup(b) => Ok(b),
        _ => Err(fail(
            ErrorKind::InvalidInput,
            format!("handle {h} is not a backup manager"),
        )),
    }
}

fn restore(h: jlong) -> R<Arc<Restore>> {
    match get(h)? {
        Entry::Restore(r) => Ok(r),
        _ => Err(fail(
            ErrorKind::InvalidInput,
            format!("handle {h} is not a restore manager"),
        )),
    }
}

fn task(h: jlong) -> R<Arc<TaskCheckpoints>> {
    match get(h)? {
        Entry::Task(t) => Ok(t),
        _ => Err(fail(
            ErrorKind::InvalidInput,
            format!("handle {h} is not a checkpoint manager's task"),
        )),
    }
}

// ----- Java values -----

fn string(env: &mut JNIEnv, s: &JString, what: &str) -> R<String> {
    if s.is_null() {
        return Err(fail(ErrorKind::InvalidInput, format!("{what} is null")));
    }
    Ok(env.get_string(s)?.into())
}

fn strings(env: &mut JNIEnv, a: &JObjectArray, what: &str) -> R<Vec<String>> {
    if a.is_null() {
        return Err(fail(ErrorKind::InvalidInput, format!("{what} is null")));
    }
    let n = env.get_array_length(a)?;
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let o = env.get_object_array_element(a, i)?;
        let s = JString::from(o);
        out.push(string(env, &s, &format!("{what}[{i}]"))?);
        env.delete_local_ref(s)?;
    }
    Ok(out)
}

/// `[k0, v0, k1, v1, …]` as a map.
fn pairs(env: &mut JNIEnv, a: &JObjectArray, what: &str) -> R<BTreeMap<String, String>> {
    let v = strings(env, a, what)?;
    if v.len() % 2 != 0 {
        return Err(fail(
            ErrorKind::InvalidInput,
            format!("{what}: an odd number of strings, not key-value pairs"),
        ));
    }
    Ok(v.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect())
}

fn to_java_strings<'a>(
    env: &mut JNIEnv<'a>,
    v: &[String],
) -> Result<JObjectArray<'a>, jni::errors::Error> {
    let a = env.new_object_array(v.len() as i32, "java/lang/String", JObject::null())?;
    for (i, s) in v.iter().enumerate() {
        let js = env.new_string(s)?;
        env.set_object_array_element(&a, i as i32, &js)?;
        env.delete_local_ref(js)?;
    }
    Ok(a)
}

fn flatten(m: &StoreMarkers) -> Vec<String> {
    m.iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect()
}

fn checkpoint_id(s: &str) -> R<CheckpointId> {
    s.parse::<CheckpointId>()
        .map_err(|e| fail(ErrorKind::InvalidInput, format!("checkpoint id {s:?}: {e}")))
}

fn context(env: &mut JNIEnv, job: &JString, job_id: &JString, task: &JString) -> R<TaskContext> {
    Ok(TaskContext {
        job_name: string(env, job, "job name")?,
        job_id: string(env, job_id, "job id")?,
        task_name: string(env, task, "task name")?,
    })
}

fn specs(env: &mut JNIEnv, stores: &JObjectArray) -> R<Vec<StoreSpec>> {
    pairs(env, stores, "stores")?
        .into_iter()
        .map(|(name, dir)| {
            if !PathBuf::from(&dir).is_absolute() {
                return Err(fail(
                    ErrorKind::InvalidInput,
                    format!("store {name:?}: its dir {dir:?} is not an absolute path"),
                ));
            }
            Ok(StoreSpec {
                name,
                dir: dir.into(),
            })
        })
        .collect()
}

// ----- completing futures -----

/// Spawns `work` for handle `ops` and completes `future` (a global reference to a raw
/// `CompletableFuture`) with its result from a runtime worker. A panic in the work (tokio
/// catches it) and a cancel complete it too.
fn spawn_op(
    ops: &Ops,
    future: GlobalRef,
    work: impl Future<Output = R<Value>> + Send + 'static,
) -> R<()> {
    let rt = runtime()?;
    let st = ops.state()?;
    if st.closed {
        return Err(fail(
            ErrorKind::InvalidInput,
            "the blobsnap handle was closed: the object was used after close()",
        ));
    }
    let token = st.cancel.clone();
    let handle = ops.tracker.spawn_on(
        async move {
            tokio::select! {
                biased;
                () = token.cancelled() => Err(fail(ErrorKind::Cancelled, "cancelled: the handle was closed or its work cancelled")),
                r = work => r,
            }
        },
        rt.handle(),
    );
    drop(st);
    rt.spawn(async move {
        let r = match handle.await {
            Ok(r) => r,
            Err(e) if e.is_panic() => {
                Err(fail(ErrorKind::Permanent, panic_message(&*e.into_panic())))
            }
            Err(e) => Err(fail(
                ErrorKind::Cancelled,
                format!("blobsnap's task ended early: {e}"),
            )),
        };
        complete(&future, r);
    });
    Ok(())
}

/// Completes a raw `CompletableFuture` from a runtime worker. Never panics out: a failure
/// here is logged (there is no Java caller to throw to).
fn complete(future: &GlobalRef, result: R<Value>) {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<(), jni::errors::Error> {
        let Some(vm) = VM.get() else {
            return Err(jni::errors::Error::NullPtr("no JVM"));
        };
        let mut env = vm.attach_current_thread_as_daemon()?;
        let r = env.with_local_frame(16, |env| -> Result<(), jni::errors::Error> {
            match &result {
                Ok(v) => {
                    let value = match v {
                        Value::Void => JObject::null(),
                        Value::Strings(s) => JObject::from(to_java_strings(env, s)?),
                    };
                    env.call_method(
                        future.as_obj(),
                        "complete",
                        "(Ljava/lang/Object;)Z",
                        &[JValue::Object(&value)],
                    )?;
                }
                Err(f) => {
                    let ex = exception(env, f)?;
                    env.call_method(
                        future.as_obj(),
                        "completeExceptionally",
                        "(Ljava/lang/Throwable;)Z",
                        &[JValue::Object(&ex)],
                    )?;
                }
            }
            Ok(())
        });
        if env.exception_check().unwrap_or(false) {
            let _ = env.exception_describe();
            let _ = env.exception_clear();
        }
        r
    }));
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "blobsnap: cannot complete a Java future"),
        Err(p) => tracing::error!("blobsnap: {}", panic_message(&*p)),
    }
}

fn future_ref(env: &mut JNIEnv, future: &JObject) -> R<GlobalRef> {
    if future.is_null() {
        return Err(fail(ErrorKind::InvalidInput, "the future is null"));
    }
    Ok(env.new_global_ref(future)?)
}

// ----- settings -----

/// Settings from Samza's config: `blobsnap.<section>.<key>` entries, passed without the
/// `blobsnap.` prefix, are the settings file's keys one to one. A value is read as a TOML
/// value where it is one (`4`, `true`), else as a string (`s3`, `last 3, every 1h for 1d`).
/// An unknown key is refused, named.
pub fn settings_from(config: &BTreeMap<String, String>) -> Result<Settings, Error> {
    let mut root = toml::Table::new();
    for (key, value) in config {
        let Some((section, name)) = key.split_once('.') else {
            return Err(invalid(format!(
                "config blobsnap.{key}: expected blobsnap.<section>.<key> (store, s3, retry, job)"
            )));
        };
        let v = match toml::from_str::<toml::Table>(&format!("v = {value}")) {
            Ok(mut t) => match t.remove("v") {
                Some(v) if !v.is_table() => v,
                _ => toml::Value::String(value.clone()),
            },
            Err(_) => toml::Value::String(value.clone()),
        };
        let table = root
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match table {
            toml::Value::Table(t) => {
                t.insert(name.to_string(), v);
            }
            _ => {
                return Err(invalid(format!(
                    "config blobsnap.{key}: {section} is not a section"
                )))
            }
        }
    }
    let settings: Settings = toml::Value::Table(root).try_into().map_err(|e| {
        invalid(format!(
            "bad blobsnap.* config (the settings file's keys, prefixed blobsnap.): {e}"
        ))
    })?;
    if settings.job.restore_mode == blobsnap::job::RestoreMode::Lazy {
        return Err(invalid(
            "blobsnap.job.restore-mode=lazy: a lazy restore opens the store with blobsnap's RocksDB, and under Samza the store is Samza's (RocksJava): use full",
        ));
    }
    Ok(settings)
}

fn init_logging() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let filter = std::env::var("BLOBSNAP_LOG").unwrap_or_else(|_| "warn".to_string());
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_target(false)
            .try_init();
    });
}

// ----- entry points (blobsnap.Native) -----

/// `static native void init()`: called once by `Native`'s static initializer, on a Java
/// thread whose class loader sees `blobsnap.BlobsnapException`.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_init<'l>(mut env: JNIEnv<'l>, _c: JClass<'l>) {
    entry(&mut env, (), |env| {
        init_logging();
        if VM.get().is_none() {
            let _ = VM.set(env.get_java_vm()?);
        }
        if EXCEPTION.get().is_none() {
            let class = env.find_class(EXCEPTION_CLASS)?;
            let _ = EXCEPTION.set(env.new_global_ref(class)?);
        }
        runtime()?;
        Ok(())
    })
}

/// `static native long engineOpen(String[] config)`: the settings as `[key, value, …]`
/// (without the `blobsnap.` prefix). Opens the store once per distinct settings.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_engineOpen<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    config: JObjectArray<'l>,
) -> jlong {
    entry(&mut env, 0, |env| {
        let config = pairs(env, &config, "config")?;
        let key = serde_json::to_string(&config)
            .map_err(|e| fail(ErrorKind::InvalidInput, e.to_string()))?;
        let cached = ENGINES
            .lock()
            .map_err(|_| fail(ErrorKind::Io, "engine cache lock poisoned"))?
            .get(&key)
            .cloned();
        let engine = match cached {
            Some(e) => e,
            None => {
                let settings = settings_from(&config)?;
                let (store, s3) = block_on(async {
                    let store = settings.open_store().await?;
                    // The admin's bucket calls (create the bucket, its abort rule) need the
                    // raw client.
                    let s3 = match settings.store.kind {
                        blobsnap::config::StoreKind::S3 => Some(
                            blobsnap::blobstore::s3::S3Store::connect(settings.s3.clone()).await?,
                        ),
                        blobsnap::config::StoreKind::Local => None,
                    };
                    Ok((store, s3))
                })?;
                let job = &settings.job;
                let factory = BlobStateBackendFactory::new(
                    Arc::clone(&store),
                    s3,
                    BackupSettings {
                        retention: job.retention.last.max(1),
                        tiered_retention: !job.retention.tiers.is_empty(),
                        gc_grace: Duration::from_secs(job.gc_grace_secs),
                        // Samza's index shape (format 1, no inline files): Samza's own
                        // restore manager reads what this route writes.
                        inline_below: 0,
                        // The lease covers each upload; close() deletes it.
                        writer_lease: true,
                        // Pre-upload follows blobsnap's RocksDB; the store is Samza's.
                        pre_upload: false,
                        ..Default::default()
                    },
                    RestoreSettings::default(),
                    job.deployment_id.clone(),
                );
                let e = Arc::new(Engine {
                    settings,
                    factory,
                    store,
                });
                ENGINES
                    .lock()
                    .map_err(|_| fail(ErrorKind::Io, "engine cache lock poisoned"))?
                    .entry(key)
                    .or_insert(e)
                    .clone()
            }
        };
        insert(Entry::Engine(engine))
    })
}

/// `static native void adminResources(long engine, String job, String jobId, boolean create)`:
/// creates (when `create` and the settings' `job.create-resources`) and validates the job's
/// resources: the bucket, the owner record of its scope (grace, deployment).
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_adminResources<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    job: JString<'l>,
    job_id: JString<'l>,
    create: bool,
) {
    entry(&mut env, (), |env| {
        let e = engine(h)?;
        let (job, job_id) = (
            string(env, &job, "job name")?,
            string(env, &job_id, "job id")?,
        );
        let admin = e.factory.admin(&job, &job_id)?;
        block_on(async {
            if create && e.settings.job.create_resources {
                admin
                    .create_resources()
                    .await
                    .map_err(|e| e.context("create the job's resources"))?;
            }
            admin
                .validate_resources()
                .await
                .map_err(|e| e.context("validate the job's resources"))?;
            Ok(())
        })
    })
}

/// `static native long backupNew(long engine, String job, String jobId, String task,
/// String[] stores, boolean prepared)`: `stores` is `[name, dir, …]`, each dir Samza's store
/// dir of the task; `prepared`: the job's checkpoints are not blobsnap's ([`History`]).
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_backupNew<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    job: JString<'l>,
    job_id: JString<'l>,
    task_name: JString<'l>,
    stores: JObjectArray<'l>,
    prepared: jboolean,
) -> jlong {
    entry(&mut env, 0, |env| {
        let (e, ctx, specs) = task_args(env, h, (&job, &job_id, &task_name), &stores)?;
        let manager = e
            .factory
            .backup_manager(&ctx, &specs, Arc::new(SystemClock))?;
        let history = match prepared {
            0 => None,
            _ => Some(History {
                store: Arc::clone(&e.store),
                job: JobScope::new(&ctx.job_name, &ctx.job_id)?,
                ctx,
                settings: e.settings.job.clone(),
                commits: OnceLock::new(),
            }),
        };
        insert(Entry::Backup(Arc::new(Backup {
            manager,
            ops: Ops::new(),
            history,
        })))
    })
}

/// The arguments every manager's constructor takes: its engine, the task, the stores.
fn task_args(
    env: &mut JNIEnv,
    h: jlong,
    (job, job_id, task): (&JString, &JString, &JString),
    stores: &JObjectArray,
) -> R<(Arc<Engine>, TaskContext, Vec<StoreSpec>)> {
    let e = engine(h)?;
    let ctx = context(env, job, job_id, task)?;
    let specs = specs(env, stores)?;
    Ok((e, ctx, specs))
}

fn checkpoint_arg(env: &mut JNIEnv, json: &JByteArray) -> R<Option<Checkpoint>> {
    if json.is_null() {
        return Ok(None);
    }
    let bytes = env.convert_byte_array(json)?;
    Ok(Some(Checkpoint::from_json(&bytes)?))
}

/// `static native void backupInit(long h, byte[] checkpointJson)` (null: a new task).
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_backupInit<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    json: JByteArray<'l>,
) {
    entry(&mut env, (), |env| {
        let b = backup(h)?;
        let cp = checkpoint_arg(env, &json)?;
        block_on(async {
            b.manager.init(cp.as_ref()).await?;
            if let Some(history) = &b.history {
                history.start(cp.as_ref()).await?;
            }
            Ok(())
        })
    })
}

/// `static native String[] backupSnapshot(long h, String checkpointId)`: synchronous, no I/O.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_backupSnapshot<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    id: JString<'l>,
) -> jobjectArray {
    entry(&mut env, std::ptr::null_mut(), |env| {
        let b = backup(h)?;
        let id = checkpoint_id(&string(env, &id, "checkpoint id")?)?;
        let m = b.manager.snapshot(id)?;
        Ok(to_java_strings(env, &flatten(&m))?.into_raw())
    })
}

/// `static native void backupUpload(long h, String checkpointId, String[] snapshotMarkers,
/// String[] dirs, CompletableFuture<String[]> f)`: `dirs` is `[store, checkpoint dir, …]`.
/// Completes with the markers; the abandon rule (half the grace since the first PUT) is
/// checked at its end.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_backupUpload<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    id: JString<'l>,
    markers: JObjectArray<'l>,
    dirs: JObjectArray<'l>,
    future: JObject<'l>,
) {
    entry(&mut env, (), |env| {
        let b = backup(h)?;
        let id = checkpoint_id(&string(env, &id, "checkpoint id")?)?;
        let markers = pairs(env, &markers, "snapshot markers")?;
        let dirs: BTreeMap<String, PathBuf> = pairs(env, &dirs, "checkpoint dirs")?
            .into_iter()
            .map(|(k, v)| (k, PathBuf::from(v)))
            .collect();
        let future = future_ref(env, &future)?;
        let b2 = Arc::clone(&b);
        spawn_op(&b.ops, future, async move {
            let out = b2.manager.upload(id, &markers, &dirs).await?;
            // A root from here on (before the bound is checked: an upload abandoned now leaves
            // a record that the task's next promotion drops).
            if let Some(history) = &b2.history {
                history.prepare(id, &out).await?;
            }
            // The commit point is Samza's: the last check this side can make is here.
            b2.manager.before_commit(id)?;
            Ok(Value::Strings(flatten(&out)))
        })
    })
}

/// `static native void backupCleanup(long h, String checkpointId, String[] markers,
/// CompletableFuture<Void> f)`: after Samza wrote the checkpoint naming `markers`.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_backupCleanup<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    id: JString<'l>,
    markers: JObjectArray<'l>,
    future: JObject<'l>,
) {
    entry(&mut env, (), |env| {
        let b = backup(h)?;
        let id = checkpoint_id(&string(env, &id, "checkpoint id")?)?;
        let markers = pairs(env, &markers, "markers")?;
        let future = future_ref(env, &future)?;
        let b2 = Arc::clone(&b);
        spawn_op(&b.ops, future, async move {
            blobsnap::crash::point("samza.before-cleanup");
            if let Some(history) = &b2.history {
                history.promote(id, &markers).await?;
            }
            b2.manager.cleanup(id, &markers).await?;
            Ok(Value::Void)
        })
    })
}

/// `static native long restoreNew(long engine, String job, String jobId, String task,
/// String[] stores)`.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_restoreNew<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    job: JString<'l>,
    job_id: JString<'l>,
    task_name: JString<'l>,
    stores: JObjectArray<'l>,
) -> jlong {
    entry(&mut env, 0, |env| {
        let (e, ctx, specs) = task_args(env, h, (&job, &job_id, &task_name), &stores)?;
        let manager = e
            .factory
            .restore_manager(&ctx, &specs, Arc::new(SystemClock))?;
        insert(Entry::Restore(Managed::new(manager)))
    })
}

/// `static native void restoreInit(long h, byte[] checkpointJson)`.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_restoreInit<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    json: JByteArray<'l>,
) {
    entry(&mut env, (), |env| {
        let r = restore(h)?;
        let cp = checkpoint_arg(env, &json)?;
        block_on(async { Ok(r.manager.init(cp.as_ref()).await?) })
    })
}

/// `static native void restoreRun(long h, CompletableFuture<Void> f)`.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_restoreRun<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    future: JObject<'l>,
) {
    entry(&mut env, (), |env| {
        let r = restore(h)?;
        let future = future_ref(env, &future)?;
        let m = Arc::clone(&r.manager);
        spawn_op(&r.ops, future, async move {
            m.restore().await?;
            Ok(Value::Void)
        })
    })
}

/// `static native long taskClaim(long engine, String job, String jobId, String task)`: the
/// checkpoint manager's task: reads its last checkpoint and claims the task (a zombie
/// writer's next checkpoint then loses).
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_taskClaim<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    job: JString<'l>,
    job_id: JString<'l>,
    task_name: JString<'l>,
) -> jlong {
    entry(&mut env, 0, |env| {
        let e = engine(h)?;
        let ctx = context(env, &job, &job_id, &task_name)?;
        let job = &e.settings.job;
        let checkpoints: Arc<dyn CheckpointStore> = Arc::new(BlobCheckpointStore::new(
            Arc::clone(&e.store),
            JobScope::new(&ctx.job_name, &ctx.job_id)?,
        ));
        // An operator's start-from (`blobsnap.job.start-from`: a rollback to a savepoint or a
        // retained checkpoint, a fork of another job), applied at the claim as the runtime
        // does: the point's checkpoint is committed as the new head, and Samza reads it.
        let from = match &job.start_from {
            Some(p) => Some(StartFrom {
                point: p.parse()?,
                id: job.start_from_id.clone(),
                grace: Duration::from_secs(job.gc_grace_secs),
            }),
            None => None,
        };
        let (commits, previous) = block_on(async {
            let previous = checkpoints
                .latest(&ctx.task_name)
                .await?
                .map(|c| c.checkpoint);
            let (commits, claim) = TaskCommitManager::start(
                ctx.clone(),
                Arc::clone(&checkpoints),
                Arc::new(SystemClock),
                job.retention.last.max(1),
                job.unsafe_no_fencing,
            )
            .await?;
            let (started, note) =
                start_task_from(&commits, &ctx, &e.store, from.as_ref(), claim).await?;
            if let Some(note) = note {
                tracing::warn!(task = %ctx.task_name, "{note}");
            }
            let previous = if from.is_some() && previous.is_some() {
                started
            } else {
                previous
            };
            Ok((commits, previous))
        })?;
        let commits = commits.with_retention_tiers(job.retention.tiers.clone());
        insert(Entry::Task(Arc::new(TaskCheckpoints { commits, previous })))
    })
}

/// `static native byte[] taskLast(long h)`: the task's last checkpoint as JSON (the one this
/// process wrote last, else the one it found at its claim); null for a task never committed.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_taskLast<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> jbyteArray {
    entry(&mut env, std::ptr::null_mut(), |env| {
        let t = task(h)?;
        let last = block_on(async { Ok(t.commits.last().await) })?;
        // The claim of a new task is an empty checkpoint of blobsnap's making: Samza sees none.
        let last = match last {
            Some(c) if t.previous.is_some() || !is_empty_claim(&c) => c,
            _ => return Ok(std::ptr::null_mut()),
        };
        let json = last.to_json()?;
        Ok(env.byte_array_from_slice(&json)?.into_raw())
    })
}

fn is_empty_claim(c: &Checkpoint) -> bool {
    c.as_v2()
        .is_some_and(|v| v.input_offsets.is_empty() && v.state_checkpoint_markers.is_empty())
}

/// `static native void taskWrite(long h, byte[] checkpointJson)`: commits Samza's CheckpointV2
/// (create-only under the task's next number, then the history trimmed to the retention).
/// `Conflict` when another writer claimed the task since.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_taskWrite<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
    json: JByteArray<'l>,
) {
    entry(&mut env, (), |env| {
        let t = task(h)?;
        let Some(cp) = checkpoint_arg(env, &json)? else {
            return Err(fail(ErrorKind::InvalidInput, "the checkpoint is null"));
        };
        let Checkpoint::V2(cp) = cp else {
            return Err(fail(
                ErrorKind::InvalidInput,
                "blobsnap's checkpoint manager writes CheckpointV2 only: set task.checkpoint.write.versions=2",
            ));
        };
        block_on(async { Ok(t.commits.commit_made(cp).await.map(|_| ())?) })
    })
}

/// `static native void cancel(long h)`: cancels the handle's work in flight (its futures
/// complete exceptionally, kind `cancelled`); the handle stays usable.
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_cancel<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
) {
    entry(&mut env, (), |_env| match get(h)? {
        Entry::Backup(b) => b.ops.cancel(),
        Entry::Restore(r) => r.ops.cancel(),
        _ => Ok(()),
    })
}

/// `static native void close(long h)`: idempotent. Removes the handle (later calls fail
/// "closed"), cancels its work in flight and waits for it (bounded), then closes the manager
/// (a backup manager deletes its writer lease).
#[no_mangle]
pub extern "system" fn Java_blobsnap_Native_close<'l>(
    mut env: JNIEnv<'l>,
    _c: JClass<'l>,
    h: jlong,
) {
    entry(&mut env, (), |_env| {
        let Some(e) = table()?.map.remove(&h) else {
            return Ok(());
        };
        match e {
            Entry::Engine(_) | Entry::Task(_) => Ok(()),
            Entry::Backup(b) => block_on(async {
                b.ops.drain().await;
                Ok(b.manager.close().await?)
            }),
            Entry::Restore(r) => block_on(async {
                r.ops.drain().await;
                Ok(r.manager.close().await?)
            }),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use blobsnap::checkpoint::CheckpointV2;

    /// Under Kafka's checkpoint manager (route 1): `init` commits Samza's last checkpoint into
    /// blobsnap's history and drops the task's prepared records up to its id, never a later one
    /// (a zombie's commit in flight); `cleanUp` commits its checkpoint once, however often it
    /// is called, and drops its record.
    #[test]
    fn a_start_commits_samzas_checkpoint_and_drops_records_up_to_it_only() {
        let dir = std::env::temp_dir().join(format!("blobsnap-jni-history-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store: Arc<dyn blobsnap::blobstore::BlobStore> =
            Arc::new(blobsnap::blobstore::local::LocalStore::new(&dir).unwrap());
        let job = JobScope::new("j", "1").unwrap();
        let task = "Partition 0";
        let id = |s: &str| s.parse::<CheckpointId>().unwrap();
        let cp = |i: &str| CheckpointV2 {
            id: id(i),
            input_offsets: BTreeMap::new(),
            state_checkpoint_markers: BTreeMap::from([(
                FACTORY_NAME.to_string(),
                BTreeMap::from([(
                    "counts".to_string(),
                    format!("index/{i}.{}.json", "0".repeat(64)),
                )]),
            )]),
        };
        let (a, b, c) = ("1700000000000-0", "1700000000001-0", "1700000000002-0");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for i in [a, b, c] {
                prepared::write(store.as_ref(), &job, task, &cp(i))
                    .await
                    .unwrap();
            }
            let h = History {
                store: Arc::clone(&store),
                job: job.clone(),
                ctx: TaskContext {
                    job_name: "j".into(),
                    job_id: "1".into(),
                    task_name: task.into(),
                },
                settings: blobsnap::config::JobConfig::default(),
                commits: OnceLock::new(),
            };
            // Samza's last checkpoint (from Kafka): the middle one.
            h.start(Some(&Checkpoint::V2(cp(b)))).await.unwrap();
            let left = |store: Arc<dyn blobsnap::blobstore::BlobStore>, job: JobScope| async move {
                prepared::list(store.as_ref(), &job, None)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|p| p.id)
                    .collect::<Vec<_>>()
            };
            assert_eq!(left(Arc::clone(&store), job.clone()).await, vec![id(c)]);
            let head = h.commits().unwrap().last().await.unwrap();
            assert_eq!(head.as_v2().unwrap().id, id(b));
            let markers = cp(c).state_checkpoint_markers[FACTORY_NAME].clone();
            h.promote(id(c), &markers).await.unwrap();
            h.promote(id(c), &markers).await.unwrap(); // a retried cleanUp
            assert!(left(Arc::clone(&store), job.clone()).await.is_empty());
            let history = BlobCheckpointStore::new(Arc::clone(&store), job.clone())
                .history(task, usize::MAX)
                .await
                .unwrap();
            let ids: Vec<_> = history
                .iter()
                .filter_map(|x| x.checkpoint.as_v2().map(|v| v.id))
                .collect();
            assert_eq!(ids.first(), Some(&id(c)), "{ids:?}");
            assert_eq!(ids.iter().filter(|i| **i == id(c)).count(), 1, "{ids:?}");
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn samza_config_maps_one_to_one_onto_the_settings_file() {
        let c: BTreeMap<String, String> = [
            ("store.kind", "s3"),
            ("s3.bucket", "b"),
            ("s3.path-style", "true"),
            ("store.max-transfers", "4"),
            ("job.retention", "last 3, every 1h for 1d"),
            ("job.gc-grace-secs", "600"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let s = settings_from(&c).unwrap();
        assert_eq!(s.store.kind, blobsnap::config::StoreKind::S3);
        assert!(s.s3.path_style);
        assert_eq!(s.store.max_transfers, 4);
        assert_eq!(s.job.retention.last, 3);
        assert_eq!(s.job.gc_grace_secs, 600);
        let typo: BTreeMap<String, String> = [("s3.bukket".to_string(), "b".to_string())].into();
        let e = settings_from(&typo).unwrap_err();
        assert!(e.to_string().contains("bukket"), "{e}");
        let lazy: BTreeMap<String, String> =
            [("job.restore-mode".to_string(), "lazy".to_string())].into();
        let e = settings_from(&lazy).unwrap_err();
        assert!(e.to_string().contains("RocksJava"), "{e}");
        let flat: BTreeMap<String, String> = [("bucket".to_string(), "b".to_string())].into();
        assert!(settings_from(&flat).is_err());
    }
}

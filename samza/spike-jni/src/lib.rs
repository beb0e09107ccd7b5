//! Spike of issue 50: a JNI call that completes a Java `CompletableFuture` from a tokio worker.
//!
//! Java side: `blobsnap.spike.NativeEcho` (samza/src/main/java). The pattern the full plug-in
//! keeps:
//!
//! - one tokio runtime (2 workers, named `blobsnap-rt-N`) per handle, made by `runtimeNew`;
//! - classes the workers need (the exception type) are looked up in `runtimeNew`, on the Java
//!   caller's thread, and kept as global references: `FindClass` on a thread attached from
//!   Rust sees only the system class loader, not the one that loaded the plug-in;
//! - a worker attaches to the JVM once, when it starts, as a daemon (the JVM can exit past it)
//!   under its Rust name (the jni crate detaches it when the thread exits), and wraps each
//!   completion in a local frame, because a thread with no Java frame never frees its local
//!   references otherwise;
//! - every entry point runs its body under `catch_unwind`; a Rust error or panic becomes a
//!   Java exception (synchronously) or an exceptionally completed future (asynchronously),
//!   never an abort of the JVM.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jni::objects::{GlobalRef, JClass, JObject, JString, JValue};
use jni::sys::jlong;
use jni::{JNIEnv, JavaVM};

const EXCEPTION_CLASS: &str = "blobsnap/spike/NativeException";

/// What a handle points to.
struct Native {
    rt: tokio::runtime::Runtime,
    /// `blobsnap.spike.NativeException`, resolved with the plug-in's class loader.
    exception_class: GlobalRef,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panic in native code: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panic in native code: {s}")
    } else {
        "panic in native code".to_string()
    }
}

/// Throws `NativeException(msg)` on the calling Java thread (a pending exception, seen by
/// Java when the native method returns).
fn throw(env: &mut JNIEnv, msg: &str) {
    if env.exception_check().unwrap_or(false) {
        return; // one already pending: keep it
    }
    let _ = env.throw_new(EXCEPTION_CLASS, msg);
}

/// Runs `body` for a native entry point: an `Err` or a panic becomes a pending Java exception
/// and `default` is returned.
fn entry<T>(
    env: &mut JNIEnv,
    default: T,
    body: impl FnOnce(&mut JNIEnv) -> Result<T, String>,
) -> T {
    match catch_unwind(AssertUnwindSafe(|| body(env))) {
        Ok(Ok(v)) => v,
        Ok(Err(msg)) => {
            throw(env, &msg);
            default
        }
        Err(p) => {
            throw(env, &panic_message(&*p));
            default
        }
    }
}

fn native<'a>(handle: jlong) -> Result<&'a Native, String> {
    if handle == 0 {
        return Err("native handle is null (closed or never opened)".to_string());
    }
    // SAFETY: a non-zero handle was made by `runtimeNew` and is not freed before
    // `runtimeClose` (the Java class zeroes its copy there; the spike does not guard a race
    // between close and a call: the full plug-in uses an Arc plus a closed flag).
    Ok(unsafe { &*(handle as *const Native) })
}

#[no_mangle]
pub extern "system" fn Java_blobsnap_spike_NativeEcho_runtimeNew<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
) -> jlong {
    entry(&mut env, 0, |env| {
        let vm = Arc::new(env.get_java_vm().map_err(|e| e.to_string())?);
        let next = Arc::new(AtomicUsize::new(0));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name_fn(move || format!("blobsnap-rt-{}", next.fetch_add(1, Ordering::Relaxed)))
            .on_thread_start(move || attach_named(&vm))
            .enable_time()
            .build()
            .map_err(|e| format!("cannot start the async runtime: {e}"))?;
        let class = env.find_class(EXCEPTION_CLASS).map_err(|e| e.to_string())?;
        let exception_class = env.new_global_ref(class).map_err(|e| e.to_string())?;
        let n = Box::new(Native {
            rt,
            exception_class,
        });
        Ok(Box::into_raw(n) as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_blobsnap_spike_NativeEcho_runtimeClose<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) {
    entry(&mut env, (), |_env| {
        if handle == 0 {
            return Ok(());
        }
        // SAFETY: see `native`; Java calls this once per handle.
        let n = unsafe { Box::from_raw(handle as *mut Native) };
        // Not on a runtime thread (a Java thread called us), so shutting down may wait.
        let Native { rt, .. } = *n;
        rt.shutdown_timeout(Duration::from_secs(10));
        Ok(())
    })
}

/// Completes `future` with `s` after a short sleep on the runtime; `fail:<msg>` completes it
/// exceptionally with `<msg>`, `panic` panics in the task.
#[no_mangle]
pub extern "system" fn Java_blobsnap_spike_NativeEcho_echoAsync<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    s: JString<'l>,
    future: JObject<'l>,
) {
    entry(&mut env, (), |env| {
        let n = native(handle)?;
        if s.is_null() {
            return Err("echoAsync: the string is null".to_string());
        }
        if future.is_null() {
            return Err("echoAsync: the future is null".to_string());
        }
        let s: String = env.get_string(&s).map_err(|e| e.to_string())?.into();
        let future = env.new_global_ref(future).map_err(|e| e.to_string())?;
        let vm = env.get_java_vm().map_err(|e| e.to_string())?;
        let exception_class = n.exception_class.clone();

        let work = n.rt.spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if s == "panic" {
                panic!("asked to panic");
            }
            match s.strip_prefix("fail:") {
                Some(msg) => Err(format!("echo failed: {msg}")),
                None => Ok(s),
            }
        });
        // A second task awaits the first, so that a panic in the work (which tokio catches
        // into the JoinHandle) still completes the future.
        n.rt.spawn(async move {
            let result = match work.await {
                Ok(r) => r,
                Err(e) if e.is_panic() => Err(panic_message(&*e.into_panic())),
                Err(e) => Err(format!("native task cancelled: {e}")),
            };
            complete(&vm, &future, &exception_class, result);
        });
        Ok(())
    })
}

/// Attaches a runtime thread to the JVM when it starts, as a daemon, and gives its
/// `java.lang.Thread` the Rust thread's name (jni 0.21 attaches with no name: the JVM would
/// call it `Thread-N`). The jni crate detaches it when the thread exits.
fn attach_named(vm: &JavaVM) {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
        let mut env = vm
            .attach_current_thread_as_daemon()
            .map_err(|e| e.to_string())?;
        let name = std::thread::current()
            .name()
            .unwrap_or("blobsnap-rt")
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
        .map_err(|e| e.to_string())
    }));
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("blobsnap-spike: cannot attach a runtime thread to the JVM: {e}"),
        Err(p) => eprintln!("blobsnap-spike: {}", panic_message(&*p)),
    }
}

/// Completes a `CompletableFuture<String>` from a runtime worker. Never panics out: a failure
/// here is printed (there is no Java caller to throw to).
fn complete(
    vm: &JavaVM,
    future: &GlobalRef,
    exception_class: &GlobalRef,
    result: Result<String, String>,
) {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
        // Attached when the thread started (`attach_named`): this returns its env.
        let mut env = vm
            .attach_current_thread_as_daemon()
            .map_err(|e| e.to_string())?;
        env.with_local_frame(8, |env| -> Result<(), jni::errors::Error> {
            match &result {
                Ok(v) => {
                    let js = env.new_string(v)?;
                    env.call_method(
                        future.as_obj(),
                        "complete",
                        "(Ljava/lang/Object;)Z",
                        &[JValue::Object(&js)],
                    )?;
                }
                Err(msg) => {
                    let jmsg = env.new_string(msg)?;
                    let class: &JClass = exception_class.as_obj().into();
                    let ex =
                        env.new_object(class, "(Ljava/lang/String;)V", &[JValue::Object(&jmsg)])?;
                    env.call_method(
                        future.as_obj(),
                        "completeExceptionally",
                        "(Ljava/lang/Throwable;)Z",
                        &[JValue::Object(&ex)],
                    )?;
                }
            }
            Ok(())
        })
        .map_err(|e| {
            // A Java exception thrown by a dependent stage run inline would be pending here.
            if env.exception_check().unwrap_or(false) {
                let _ = env.exception_describe();
                let _ = env.exception_clear();
            }
            e.to_string()
        })
    }));
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("blobsnap-spike: cannot complete a Java future: {e}"),
        Err(p) => eprintln!("blobsnap-spike: {}", panic_message(&*p)),
    }
}

//! The server scripts' bookkeeping (minio/common.sh), which lets two clones or two CI runs
//! share one machine: a PID file is trusted only while that PID is still the instance's
//! server, and an instance whose owner is gone (a run killed at its time limit) is stopped
//! and deleted by the next start — while a live owner's instance is left alone.

use std::path::Path;
use std::process::{Child, Command};

/// Runs `script` in bash after sourcing minio/common.sh with TOOLS=`tools`.
fn common(tools: &Path, script: &str) -> std::process::Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -euo pipefail; TOOLS={tools:?}; source {:?}; {script}",
            concat!(env!("CARGO_MANIFEST_DIR"), "/minio/common.sh"),
            tools = tools.display().to_string()
        ))
        .output()
        .expect("run bash")
}

/// A stand-in server: a `sleep` whose working directory is the instance dir (how the scripts
/// recognize LocalStack), in its own process group.
fn fake_server(dir: &Path) -> Child {
    use std::os::unix::process::CommandExt as _;
    let child = Command::new("sleep")
        .arg("300")
        .current_dir(dir)
        .process_group(0)
        .spawn()
        .unwrap();
    std::fs::write(dir.join("pid"), child.id().to_string()).unwrap();
    child
}

fn alive(child: &mut Child) -> bool {
    child.try_wait().unwrap().is_none()
}

#[test]
fn orphans_are_reaped_live_instances_and_foreign_pids_are_left_alone() {
    let tools = tempfile::tempdir().unwrap();
    let instances = tools.path().join("instances");
    std::fs::create_dir_all(&instances).unwrap();
    let stop = "stop_one() { local pid; pid=$(cat \"$1/pid\"); if pid_is_ours \"$pid\" \"$1\"; then stop_pid \"$pid\"; fi; }";

    // An instance whose owner is gone (a dead process), registered by a link.
    let orphan = tempfile::tempdir().unwrap();
    let mut orphan_server = fake_server(orphan.path());
    let mut dead = Command::new("true").spawn().unwrap();
    dead.wait().unwrap();
    std::fs::write(orphan.path().join("owner"), format!("{} 1", dead.id())).unwrap();
    let out = common(
        tools.path(),
        &format!(
            "register_instance fake {:?}",
            orphan.path().display().to_string()
        ),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An instance whose owner lives (this test process), inside instances/.
    let live = instances.join("fake-live");
    std::fs::create_dir_all(&live).unwrap();
    let mut live_server = fake_server(&live);
    let out = common(
        tools.path(),
        &format!(
            "BLOBSNAP_OWNER_PID={} write_owner {:?}",
            std::process::id(),
            live.display().to_string()
        ),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An orphan whose PID file names a process that is not its server (PID reuse): the
    // process must survive, the dir still goes.
    let stale = instances.join("fake-stale");
    std::fs::create_dir_all(&stale).unwrap();
    let mut bystander = Command::new("sleep").arg("300").spawn().unwrap();
    std::fs::write(stale.join("pid"), bystander.id().to_string()).unwrap();
    std::fs::write(stale.join("owner"), format!("{} 1", dead.id())).unwrap();

    let out = common(
        tools.path(),
        &format!("{stop}; reap_orphans fake /nonexistent stop_one"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = String::from_utf8_lossy(&out.stderr);

    assert!(
        orphan_server.try_wait().unwrap().is_some(),
        "the orphan's server was stopped: {log}"
    );
    assert!(
        !orphan.path().exists(),
        "the orphan's state was deleted: {log}"
    );
    assert!(
        alive(&mut live_server),
        "a live owner's server is left alone: {log}"
    );
    assert!(live.join("pid").exists(), "and its state: {log}");
    assert!(
        alive(&mut bystander),
        "a PID that is not the instance's server is never signalled"
    );
    assert!(
        !stale.exists(),
        "the stale instance's dir was deleted: {log}"
    );
    assert_eq!(
        std::fs::read_dir(&instances).unwrap().count(),
        1,
        "only the live instance is registered"
    );

    for c in [&mut live_server, &mut bystander] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[test]
fn free_port_ranges_are_free() {
    let tools = tempfile::tempdir().unwrap();
    let out = common(tools.path(), "free_port_range 30");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let base: u16 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(base >= 20000);
    // Taken by us: the check must see it.
    let held = std::net::TcpListener::bind(("127.0.0.1", base)).unwrap();
    let out = common(tools.path(), &format!("port_free {base}"));
    assert!(!out.status.success(), "a bound port is not free");
    drop(held);
}

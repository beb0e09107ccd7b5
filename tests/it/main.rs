//! The integration suites, one module per suite, linked into one test binary (each binary
//! links RocksDB and the AWS SDK: one link instead of fifteen). Three suites stay binaries of
//! their own because they need the process to themselves: `bounded` (it samples the
//! process's descriptors and memory), `secrets` (a global trace-level log subscriber) and
//! `garage_cluster` (it starts and kills a three-node cluster).
//!
//! Run one suite with `cargo test --test it -- lifecycle::`, the external-server cases of all
//! with `cargo test --tests -- --ignored external::` (scripts/test.sh).

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod admin;
mod backup;
mod cli;
mod commit_protocol;
mod conformance;
mod damaged;
mod docs;
mod faults;
mod forks;
mod formats;
mod fuzz;
mod gc_model;
mod guard;
mod interop;
mod lifecycle;
mod loopback_only;
mod prereqs;
mod preupload;
mod restore;
mod restore_crash;
mod server_scripts;
mod standby;
mod unsafe_scope;

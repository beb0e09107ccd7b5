//! Inspection: `check`, `usage`, `cost`, `verify` — read-only, failing closed.

pub mod check;
pub mod cost;
pub mod usage;
pub mod verify;

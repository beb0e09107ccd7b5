//! Collection (DESIGN §7 step 4, §9): the sweep, and the resources and writer leases that guard it.

pub mod admin;
pub mod gc;
pub mod remove;

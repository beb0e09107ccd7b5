//! State through time (DESIGN §10): the history and references, savepoints, forks, the records they read, manual backups.

pub mod fork;
pub mod history;
pub mod manual;
pub mod prepared;
pub mod record;
pub mod savepoint;

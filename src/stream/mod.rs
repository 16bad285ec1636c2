//! The StreamService: writing entries. One RPC per file.

mod append;

pub use append::{Streams, MAX_BATCH_ENTRIES, MAX_FIELDS_PER_ENTRY};

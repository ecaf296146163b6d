//! # narad-raft
//!
//! The metastore: openraft log storage, the state machine of topics, users,
//! grants, schemas, partition assignments and nodes, snapshots, and typed
//! commands. Not started yet.

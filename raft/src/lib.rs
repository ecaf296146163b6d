//! # narad-raft
//!
//! The metastore: cluster metadata that every node holds in full, changed
//! only through typed commands that Raft orders. Built so far:
//! - [`state`]: the commands and the deterministic state machine they apply
//!   to (topics and their partition assignments), with every rule a topic
//!   change must keep.
//!
//! Still to come: openraft 0.9 on its own thread with durable log storage and
//! snapshots, and the commands for users, grants, schemas, children and moves.

pub mod state;

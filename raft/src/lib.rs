//! # narad-raft
//!
//! The metastore: cluster metadata that every node holds in full, changed
//! only through typed commands that Raft orders. Built so far:
//! - [`state`]: the commands and the deterministic state machine they apply
//!   to (topics and their partition assignments), with every rule a topic
//!   change must keep.
//!
//! - [`store`]: durable openraft storage: the log (checksummed frames,
//!   fdatasynced per append, torn tail cut), the vote and snapshots;
//! - [`node`]: openraft 0.9 on its own thread, bootstrap of a single-member
//!   cluster, proposals, the published applied state.
//!
//! Still to come: the QUIC network between nodes, and the commands for
//! users, grants, schemas, children and moves.

pub mod node;
pub mod state;
pub mod store;

//! # narad-raft
//!
//! The metastore: cluster metadata that every node holds in full, changed
//! only through typed commands that Raft orders:
//! - [`state`]: the commands and the deterministic state machine they apply
//!   to (topics, partition assignments, the cluster id and node states), with every rule a topic
//!   change must keep.
//!
//! - [`store`]: durable openraft storage: the log (checksummed frames,
//!   fdatasynced per append; a torn tail is cut, damage that hides an entry
//!   refuses the start), the vote and snapshots;
//! - [`detector`]: the failure detector's rule on a clock it is given;
//! - [`node`]: openraft 0.9 on its own thread, bootstrap (one node, or the
//!   initial members), writes forwarded to the leader, the controller that
//!   marks nodes dead and alive, leadership handover; other nodes are
//!   reached through [`node::PeerCaller`] (the broker's QUIC endpoint).

pub mod detector;
pub mod moves;
pub mod node;
pub mod prevote;
pub mod state;
pub mod store;

//! # narad-broker
//!
//! The Narad node. Built so far, as sans-IO pieces with their tests:
//! - [`dispatcher`]: the batching policy that commits durable WAL records to
//!   partition owners (adaptive linger, retry, reroute signal);
//! - [`leases`]: one partition's leases, delivery counts, nack delays and the
//!   expiry sweep;
//! - [`config`]: every config key with its default and the precedence of
//!   flags, environment, file and defaults;
//! - [`owner`]: one partition's owner: commit, consume under leases, ack,
//!   nack, extend, sweep and dead-letter selection, long-poll wake-ups, stats;
//! - [`receipt`]: receipts that name topic, partition, offset, lease and owner
//!   epoch under a MAC, so they cannot be forged.
//!
//! Still to come (issue 3): shards on glommio, the HTTP server, the
//! dispatcher, the partition owner, the metastore and the `narad` CLI.

pub mod api;
pub mod cli;
pub mod config;
pub mod dispatcher;
pub mod errors;
pub mod leases;
pub mod mesh;
pub mod node;
pub mod owner;
pub mod partitioner;
pub mod receipt;
pub mod remote;
pub mod shard;
pub mod signal;

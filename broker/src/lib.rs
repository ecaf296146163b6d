//! # narad-broker
//!
//! The Narad node and the `narad` command line:
//! - [`node`]: start and stop, the data folder's lock and identity, one
//!   glommio executor per shard, the graceful stop;
//! - [`shard`]: one shard: produce into its WAL, the dispatcher loop,
//!   partition owners, consume, settle, dead-lettering, topic admin;
//! - [`rpc`]: operations as types, the transport that carries them and
//!   their wire form; [`mesh`] and [`remote`]: that transport between
//!   shards and between nodes;
//! - [`api`] and [`errors`]: the HTTP API's routes and the one mapping of
//!   errors to status codes; [`cli`]: the client subcommands;
//! - sans-IO pieces with their tests: [`route`] (where a partition lives,
//!   grouping by location, consume and reroute order, answers back in
//!   request order), [`dispatcher`] (batching, retry, reroute), [`leases`], [`owner`] (one partition), [`receipt`] (receipts
//!   under a MAC), [`partitioner`], [`signal`], [`config`] (every key, its
//!   default and the precedence of flags, environment, file and defaults).

pub mod api;
pub mod auth;
pub mod cli;
pub mod config;
pub mod controller;
pub mod dispatcher;
pub mod errors;
pub mod folders;
pub mod idempotency;
pub mod kafka;
pub mod leases;
pub mod limits;
pub mod mesh;
pub mod metastore;
pub mod metric_names;
pub mod node;
pub mod owner;
pub mod partitioner;
pub mod rates;
pub mod receipt;
pub mod recovered;
pub mod remote;
pub mod route;
pub mod rpc;
pub mod runtime;
pub mod schemas;
pub mod settings;
pub mod shard;
pub mod ship;
pub mod signal;
pub mod wakeups;

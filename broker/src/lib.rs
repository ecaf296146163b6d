//! # narad-broker
//!
//! The Narad node: shards (one glommio executor per core), the dispatcher,
//! leases, consume routing, the controller, HTTP handlers, configuration and
//! the `narad` CLI. Not started yet: it arrives with the single-node issue and
//! stands on `narad-storage`.

//! The pieces of the cluster simulation (`tests/simulation.rs`).

pub mod cluster;
pub mod disk;
pub mod executor;

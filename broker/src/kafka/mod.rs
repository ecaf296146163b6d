//! The Kafka protocol, for the Kafka listener: framing and request headers
//! ([`frame`]), the answer to ApiVersions ([`versions`]), and a producer's
//! record batches as messages ([`records`]). Sans-IO, tested on its own;
//! the listener that serves them on each shard comes with the APIs a stock
//! producer needs.

pub mod frame;
pub mod records;
pub mod versions;

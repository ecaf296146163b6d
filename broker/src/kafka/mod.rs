//! The Kafka protocol listener: framing and request headers ([`frame`]),
//! the answer to ApiVersions ([`versions`]), the fence of idempotent
//! producers' epochs ([`epochs`]), whom Metadata names while an owner does
//! not answer ([`leaders`]), a producer's record batches as
//! messages ([`records`]), the one mapping of API errors to Kafka's
//! ([`errors`]), the answers of each served API on the shard's own code
//! paths ([`serve`]), who a connection speaks for ([`sasl`]), share groups
//! on Narad's leases ([`share`]), and the sockets ([`listener`]). All but the last are
//! sans-IO and tested on their own.

pub mod epochs;
pub mod errors;
pub mod frame;
pub mod leaders;
pub mod listener;
pub mod records;
pub mod sasl;
pub mod serve;
pub mod share;
pub mod versions;

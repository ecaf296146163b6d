//! # narad-net
//!
//! The wire of Narad, as `../shared/API.md` fixes it:
//! - [`error`]: every error code, its HTTP status and whether to retry it, in
//!   one exhaustive mapping, and the JSON error shape;
//! - [`names`]: topic name validation;
//! - [`value`]: message bytes as `value` (UTF-8) or `value_base64`;
//! - [`types`]: request and response bodies of the data plane and topic admin;
//! - [`batch`]: whole-batch validation of a batch produce;
//! - [`http_server`]: hyper 1.x on glommio, with our own header, body and
//!   idle timeouts and body size limit.
//!
//! - [`client`]: a small blocking client of the HTTP API with API.md's retry
//!   rules (the CLI uses it).
//!
//! Still to come here: the inter-node QUIC transport.

pub mod batch;
pub mod client;
pub mod error;
pub mod http_server;
pub mod names;
pub mod peer;
pub mod types;
pub mod value;

pub use error::{ApiError, ErrorCode};

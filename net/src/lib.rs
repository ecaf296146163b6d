//! # narad-net
//!
//! The wire of Narad: the HTTP API of `docs/http-api.md`, and QUIC between nodes:
//! - [`error`]: every error code, its HTTP status and whether to retry it, in
//!   one exhaustive mapping, and the JSON error shape;
//! - [`names`]: topic name validation;
//! - [`value`]: message bytes as `value` (UTF-8) or `value_base64`;
//! - [`types`]: request and response bodies of the data plane and topic admin;
//! - [`batch`]: whole-batch validation of a batch produce;
//! - [`http_server`]: hyper 1.x on glommio, with our own header, body and
//!   idle timeouts, body size limit and the node-wide connection and body
//!   budget;
//! - [`client`]: what every client shares (the retry policy of
//!   `docs/status-codes.md`, path encoding); the client is `narad-client`;
//! - [`tls`]: TLS on the client port (reloadable) and for clients;
//! - [`peer`]: QUIC between nodes with mutual TLS (quinn, rustls).

pub mod batch;
pub mod client;
pub mod error;
pub mod http_server;
pub mod names;
pub mod peer;
pub mod query;
pub mod tls;
pub mod types;
pub mod value;

pub use error::{ApiError, ErrorCode};

//! # narad-net
//!
//! The wire of Narad, as `../shared/API.md` fixes it:
//! - [`error`]: every error code, its HTTP status and whether to retry it, in
//!   one exhaustive mapping, and the JSON error shape;
//! - [`names`]: topic name validation;
//! - [`value`]: message bytes as `value` (UTF-8) or `value_base64`;
//! - [`types`]: request and response bodies of the data plane and topic admin;
//! - [`batch`]: whole-batch validation of a batch produce.
//!
//! Still to come here: the hyper-on-glommio server glue, the inter-node QUIC
//! transport and the Rust client library.

pub mod batch;
pub mod error;
pub mod names;
pub mod types;
pub mod value;

pub use error::{ApiError, ErrorCode};

//! # narad-net
//!
//! The wire: API types, HTTP server glue for hyper on glommio, the inter-node
//! QUIC transport (quinn, rustls, mutual TLS), and the Rust client library
//! used by the CLI, the bench and the tests. Not started yet.

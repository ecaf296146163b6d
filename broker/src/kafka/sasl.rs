//! Who a Kafka connection speaks for. With `auth.enabled` a connection
//! (over TLS, which the node insists on) starts unauthenticated: it may ask
//! ApiVersions, then SaslHandshake (PLAIN) and SaslAuthenticate with a
//! Narad user and password, or the user `token` and a bearer token, checked
//! by the same code as HTTP's `Authorization` header. Any other request
//! before that closes the connection, as a failed authentication does once
//! its answer is written. From then on every request is that user's, and
//! grants apply as over HTTP ([`Caller`]). A connection whose credentials
//! are revoked (the user deleted, its password changed, the token revoked)
//! is closed at its next request, or within
//! [`crate::limits::KAFKA_SESSION_CHECK_INTERVAL`] while idle: the client
//! connects again and must sign in anew. With auth off, anyone may do
//! anything and SASL is refused.

use std::cell::RefCell;

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use narad_net::ApiError;
use narad_raft::state::Action;

use super::frame::Request;
use super::serve::{decode, encode, error_label, Answer, Answerer, NO_ERROR};
use crate::auth;

/// The one SASL mechanism the listener takes.
const PLAIN: &str = "PLAIN";

/// Who sends a connection's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// `auth.enabled` is false: anyone may do anything.
    Anyone,
    /// The user the connection authenticated as.
    User(String),
}

/// Where a connection is in its authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stage {
    /// Waiting for SaslHandshake.
    Handshake,
    /// SaslHandshake chose PLAIN: waiting for SaslAuthenticate.
    Authenticate,
    /// Every request is this caller's.
    Done(Caller),
}

/// One connection's authentication.
#[derive(Debug)]
pub struct Login {
    stage: RefCell<Stage>,
    /// What its credentials stood on at sign-in (none with auth off).
    standing: RefCell<Option<auth::Standing>>,
}

impl Login {
    /// A new connection's: done at once when auth is off.
    pub fn new(auth_enabled: bool) -> Self {
        let stage = if auth_enabled {
            Stage::Handshake
        } else {
            Stage::Done(Caller::Anyone)
        };
        Self {
            stage: RefCell::new(stage),
            standing: RefCell::new(None),
        }
    }

    /// The caller, once authenticated.
    pub fn caller(&self) -> Option<Caller> {
        match &*self.stage.borrow() {
            Stage::Done(caller) => Some(caller.clone()),
            _ => None,
        }
    }

    /// Whether the connection is authenticated (its requests may then run
    /// side by side; until then one at a time, in order).
    pub fn done(&self) -> bool {
        matches!(&*self.stage.borrow(), Stage::Done(_))
    }
}

/// Whether an API may be asked before authentication.
pub fn before_login(key: ApiKey) -> bool {
    matches!(
        key,
        ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
    )
}

impl Answerer {
    /// Whether the credentials `login` signed in with still hold (always,
    /// before sign-in and with auth off).
    pub fn login_holds(&self, login: &Login) -> bool {
        login
            .standing
            .borrow()
            .as_ref()
            .is_none_or(|standing| standing.holds(&self.shard.meta().view().state))
    }

    /// Whether `caller` may do `action` on `topic`: 403's error when not.
    pub(super) fn may(&self, caller: &Caller, action: Action, topic: &str) -> Result<(), ApiError> {
        match caller {
            Caller::Anyone => Ok(()),
            Caller::User(user) => self.shard.authorize(user, action, Some(topic)),
        }
    }

    /// Whether `caller` may see `topic` at all (Metadata lists only those).
    pub(super) fn sees(&self, caller: &Caller, topic: &str) -> bool {
        match caller {
            Caller::Anyone => true,
            Caller::User(user) => self.shard.sees_topic(user, topic),
        }
    }

    /// SaslHandshake: PLAIN is the mechanism, and only with auth on.
    pub(super) fn sasl_handshake(&self, request: &Request, login: &Login) -> Answer {
        let body = match decode::<SaslHandshakeRequest>(request) {
            Ok(body) => body,
            Err(why) => return Answer::Close(why),
        };
        let mechanisms = vec![StrBytes::from_static_str(PLAIN)];
        let stage = login.stage.borrow().clone();
        let error = match stage {
            Stage::Handshake if body.mechanism.as_str() != PLAIN => {
                Some(ResponseError::UnsupportedSaslMechanism)
            }
            Stage::Handshake => None,
            // Auth off, a second handshake, or one after signing in.
            Stage::Authenticate | Stage::Done(_) => Some(ResponseError::IllegalSaslState),
        };
        // With auth off no mechanism is offered.
        let offered = if stage == Stage::Done(Caller::Anyone) {
            Vec::new()
        } else {
            mechanisms
        };
        let answer = SaslHandshakeResponse::default()
            .with_error_code(error.map_or(0, |e| e.code()))
            .with_mechanisms(offered);
        super::serve::count("sasl_handshake", error.map_or(NO_ERROR, error_label));
        match (error, encode(request, &answer)) {
            (None, Ok(frame)) => {
                *login.stage.borrow_mut() = Stage::Authenticate;
                Answer::Frame(frame)
            }
            (Some(_), Ok(frame)) => Answer::FrameThenClose(
                frame,
                "SASL handshake refused (auth.enabled is false, a repeat, or not PLAIN)".into(),
            ),
            (_, Err(error)) => Answer::Close(error.to_string()),
        }
    }

    /// SaslAuthenticate: the PLAIN message's user and password (or token),
    /// checked as HTTP's credentials are. A failure is answered with its
    /// reason, then the connection closes.
    pub(super) async fn sasl_authenticate(&self, request: &Request, login: &Login) -> Answer {
        let body = match decode::<SaslAuthenticateRequest>(request) {
            Ok(body) => body,
            Err(why) => return Answer::Close(why),
        };
        let stage = login.stage.borrow().clone();
        let outcome = match stage {
            Stage::Authenticate => match auth::sasl_plain(&body.auth_bytes) {
                Ok(credentials) => {
                    let signed_in = self
                        .shard
                        .authenticate_with(credentials.clone())
                        .await
                        .map_err(|e| (ResponseError::SaslAuthenticationFailed, e.message));
                    if signed_in.is_ok() {
                        *login.standing.borrow_mut() =
                            auth::Standing::of(&self.shard.meta().view().state, &credentials);
                    }
                    signed_in
                }
                Err(error) => Err((ResponseError::SaslAuthenticationFailed, error.message)),
            },
            _ => Err((
                ResponseError::IllegalSaslState,
                "SaslAuthenticate comes once, after a SaslHandshake for PLAIN".to_string(),
            )),
        };
        let answer = SaslAuthenticateResponse::default().with_auth_bytes(Bytes::new());
        let (answer, error) = match &outcome {
            Ok(_) => (answer, None),
            Err((error, message)) => (
                answer
                    .with_error_code(error.code())
                    .with_error_message(Some(StrBytes::from_string(message.clone()))),
                Some(*error),
            ),
        };
        super::serve::count("sasl_authenticate", error.map_or(NO_ERROR, error_label));
        match (outcome, encode(request, &answer)) {
            (Ok(user), Ok(frame)) => {
                *login.stage.borrow_mut() = Stage::Done(Caller::User(user));
                Answer::Frame(frame)
            }
            (Err((_, message)), Ok(frame)) => Answer::FrameThenClose(frame, message),
            (_, Err(error)) => Answer::Close(error.to_string()),
        }
    }
}

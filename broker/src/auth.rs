//! Who a request comes from, and what its user may do (docs/security.md).
//!
//! - Passwords are kept as argon2id hashes (PHC strings) in the metastore;
//!   a password is checked against its hash once per shard and then
//!   remembered as a BLAKE3 digest of the user and password beside the hash
//!   it matched, so the data path pays a hash lookup, and a changed password
//!   (a new hash) ends what was remembered at once.
//! - A bearer token is `nrd_<id>_<secret>`: the id finds its record, and
//!   the record holds only the BLAKE3 hash of the 256-bit secret (a secret
//!   that long cannot be guessed, so a fast hash is safe and needs no cache).
//! - Grants name a topic or a prefix (`billing.*`) with actions; the user
//!   `admin` holds every grant.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Read;
use std::sync::OnceLock;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use base64::Engine;
use narad_net::{ApiError, ErrorCode};
use narad_raft::state::{Action, Grant, MetaState, ADMIN_USER};

use crate::limits::{PASSWORD_BYTES_MAX, USER_NAME_BYTES_MAX, VERIFIED_PASSWORDS_MAX};

/// What a request says about who sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    Basic { user: String, password: String },
    Bearer(String),
}

fn unauthenticated(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Unauthenticated, message)
}

/// The credentials of an `Authorization` header; 401 when there are none
/// or they cannot be read.
pub fn credentials(header: Option<&[u8]>) -> Result<Credentials, ApiError> {
    let Some(header) = header else {
        return Err(unauthenticated(
            "credentials needed: send Authorization: Basic (user and password) or Bearer (a token)",
        ));
    };
    let text = std::str::from_utf8(header)
        .map_err(|_| unauthenticated("the Authorization header is not text"))?;
    let (scheme, rest) = text.trim().split_once(' ').unwrap_or((text, ""));
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") && !rest.is_empty() {
        return Ok(Credentials::Bearer(rest.to_string()));
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(|| {
                unauthenticated("the Basic credentials are not base64 of user:password")
            })?;
        if let Some((user, password)) = decoded.split_once(':') {
            return Ok(Credentials::Basic {
                user: user.to_string(),
                password: password.to_string(),
            });
        }
        return Err(unauthenticated(
            "the Basic credentials are not base64 of user:password",
        ));
    }
    Err(unauthenticated(
        "the Authorization header must be Basic or Bearer",
    ))
}

/// The SASL PLAIN user name that carries a bearer token as its password.
pub const SASL_TOKEN_USER: &str = "token";

/// The credentials of a SASL PLAIN message (RFC 4616: an authorization
/// identity, the user and the password, split by NUL bytes): a user and
/// password, or the user [`SASL_TOKEN_USER`] with a bearer token. An
/// authorization identity, if given, must be the user itself.
pub fn sasl_plain(message: &[u8]) -> Result<Credentials, ApiError> {
    let text = std::str::from_utf8(message)
        .map_err(|_| unauthenticated("the SASL PLAIN message is not UTF-8"))?;
    let mut parts = text.split('\0');
    let (Some(identity), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(unauthenticated(
            "the SASL PLAIN message is not identity NUL user NUL password",
        ));
    };
    if user.is_empty() || password.is_empty() {
        return Err(unauthenticated(
            "SASL PLAIN needs a user name and a password",
        ));
    }
    if !identity.is_empty() && identity != user {
        return Err(unauthenticated(
            "acting as another user (a SASL authorization identity) is not supported",
        ));
    }
    if user == SASL_TOKEN_USER {
        return Ok(Credentials::Bearer(password.to_string()));
    }
    Ok(Credentials::Basic {
        user: user.to_string(),
        password: password.to_string(),
    })
}

/// `[A-Za-z0-9._@-]{1,128}`: a user's name, as it appears in paths.
pub fn validate_user_name(name: &str) -> Result<(), ApiError> {
    let valid = !name.is_empty()
        && name.len() <= USER_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'));
    if valid {
        return Ok(());
    }
    let shown: String = name.chars().take(64).collect();
    Err(ApiError::new(
        ErrorCode::InvalidRequest,
        format!("user name {shown:?} must be 1 to {USER_NAME_BYTES_MAX} characters of A-Z, a-z, 0-9, '.', '_', '@' or '-'"),
    ))
}

/// A password a user may be given.
pub fn validate_password(password: &str) -> Result<(), ApiError> {
    if password.is_empty() || password.len() > PASSWORD_BYTES_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("a password must be 1 to {PASSWORD_BYTES_MAX} bytes"),
        ));
    }
    Ok(())
}

/// `N` bytes from the kernel's random source.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], String> {
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("reading /dev/urandom: {e}"))?;
    Ok(bytes)
}

/// The argon2id hash of a password, with a fresh salt (slow on purpose:
/// call it off the shard's thread).
pub fn hash_password(password: &str) -> Result<String, String> {
    let salt_bytes = random_bytes::<16>()?;
    let salt = SaltString::encode_b64(&salt_bytes).map_err(|e| e.to_string())?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| format!("hashing a password: {e}"))
}

/// Whether `password` matches the argon2 `hash` (slow on purpose).
pub fn verify_password(hash: &str, password: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| {
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// A hash to check passwords of unknown users against, so that an answer
/// takes as long whether or not the user exists.
pub fn decoy_hash() -> &'static str {
    static DECOY: OnceLock<String> = OnceLock::new();
    DECOY.get_or_init(|| hash_password("narad-decoy").unwrap_or_default())
}

/// A new token: its id, the token as its user sees it once, and the hash
/// the metastore keeps.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub id: String,
    pub token: String,
    pub secret_hash: String,
}

const TOKEN_PREFIX: &str = "nrd_";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn new_token() -> Result<NewToken, String> {
    let id = hex(&random_bytes::<8>()?);
    let secret = hex(&random_bytes::<32>()?);
    Ok(NewToken {
        token: format!("{TOKEN_PREFIX}{id}_{secret}"),
        secret_hash: secret_hash(&secret),
        id,
    })
}

fn secret_hash(secret: &str) -> String {
    blake3::hash(secret.as_bytes()).to_hex().to_string()
}

/// The user a bearer token acts as, if it is one the metastore holds.
pub fn token_user<'s>(state: &'s MetaState, token: &str) -> Option<&'s str> {
    let (id, secret) = token.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
    let record = state.tokens.get(id)?;
    let hash = blake3::hash(secret.as_bytes()).to_hex();
    let matches = constant_time_eq(record.secret_hash.as_bytes(), hash.as_bytes());
    (matches && state.users.contains_key(&record.user)).then_some(record.user.as_str())
}

/// What a signed-in session's credentials stood on, so that a session
/// that outlives them (a Kafka connection) can tell when they are gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// The user's password as it was hashed at sign-in: deleting the user
    /// or changing its password ends it.
    Password { user: String, hash: String },
    /// The token by its id: revoking it or deleting its user ends it.
    Token { id: String },
}

impl Standing {
    /// What `credentials`, just accepted, stand on in `state`.
    pub fn of(state: &MetaState, credentials: &Credentials) -> Option<Self> {
        match credentials {
            Credentials::Basic { user, .. } => Some(Self::Password {
                user: user.clone(),
                hash: state.users.get(user)?.password_hash.clone(),
            }),
            Credentials::Bearer(token) => {
                let (id, _) = token.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
                Some(Self::Token { id: id.to_string() })
            }
        }
    }

    /// Whether the credentials still hold in `state`.
    pub fn holds(&self, state: &MetaState) -> bool {
        match self {
            Self::Password { user, hash } => state
                .users
                .get(user)
                .is_some_and(|u| &u.password_hash == hash),
            Self::Token { id } => state
                .tokens
                .get(id)
                .is_some_and(|t| state.users.contains_key(&t.user)),
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Passwords this shard checked, as digests of user and password with the
/// hash each matched; bounded (emptied when full).
#[derive(Default)]
pub struct VerifiedPasswords {
    verified: RefCell<HashMap<[u8; 32], String>>,
}

fn credential_digest(user: &str, password: &str) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(user.as_bytes());
    hasher.update(&[0]);
    hasher.update(password.as_bytes());
    *hasher.finalize().as_bytes()
}

impl VerifiedPasswords {
    /// Whether this user and password were verified against `hash`, the
    /// user's hash now.
    pub fn known(&self, user: &str, password: &str, hash: &str) -> bool {
        self.verified
            .borrow()
            .get(&credential_digest(user, password))
            .is_some_and(|verified| verified == hash)
    }

    pub fn remember(&self, user: &str, password: &str, hash: &str) {
        let mut verified = self.verified.borrow_mut();
        if verified.len() >= VERIFIED_PASSWORDS_MAX {
            verified.clear();
        }
        verified.insert(credential_digest(user, password), hash.to_string());
    }
}

/// Whether `user` may do `action` (on `topic`, for the topic actions; the
/// `cluster` action is about no topic).
pub fn allows(state: &MetaState, user: &str, action: Action, topic: Option<&str>) -> bool {
    if user == ADMIN_USER {
        return true;
    }
    state.users.get(user).is_some_and(|record| {
        record
            .grants
            .iter()
            .any(|g| g.actions.contains(&action) && topic.is_none_or(|t| g.matches(t)))
    })
}

/// Whether `user` holds any grant on `topic` (`GET /v1/topics` lists those).
pub fn sees(state: &MetaState, user: &str, topic: &str) -> bool {
    user == ADMIN_USER
        || state
            .users
            .get(user)
            .is_some_and(|record| record.grants.iter().any(|g| g.matches(topic)))
}

pub fn forbidden(user: &str, action: Action, topic: Option<&str>) -> ApiError {
    let what = match topic {
        Some(topic) => format!("the {} grant on topic {topic:?}", action.as_str()),
        None => format!("the {} grant", action.as_str()),
    };
    ApiError::new(
        ErrorCode::Forbidden,
        format!("user {user:?} does not hold {what}"),
    )
}

/// Checks a grant list a client sent: topic patterns are a topic name, a
/// prefix ending in `*`, or `*`; `cluster` is granted on `*` only.
pub fn validate_grants(grants: &[Grant]) -> Result<(), ApiError> {
    let invalid = |message: String| ApiError::new(ErrorCode::InvalidRequest, message);
    for (index, grant) in grants.iter().enumerate() {
        let name = grant.topic.strip_suffix('*').unwrap_or(&grant.topic);
        // Empty only in `*` (every topic): an empty pattern covers nothing.
        let pattern_ok = if name.is_empty() {
            grant.topic == "*"
        } else {
            narad_net::names::is_valid_topic_name(name)
        };
        if !pattern_ok || name.contains('*') {
            return Err(invalid(format!(
                "grants[{index}].topic {:?} must be a topic name, a prefix ending in '*', or '*'",
                grant.topic
            )));
        }
        if grant.actions.is_empty() {
            return Err(invalid(format!("grants[{index}].actions is empty")));
        }
        if grant.actions.contains(&Action::Cluster) && grant.topic != "*" {
            return Err(invalid(format!(
                "grants[{index}]: the cluster action is about no topic; grant it on \"*\""
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_raft::state::{Token, User};

    fn state_with(user: &str, grants: Vec<Grant>) -> MetaState {
        let mut state = MetaState::default();
        state.users.insert(
            user.into(),
            User {
                password_hash: String::new(),
                grants,
                created_at_ms: 0,
            },
        );
        state
    }

    #[test]
    fn both_header_forms_are_read_and_anything_else_is_401() {
        let basic = base64::engine::general_purpose::STANDARD.encode("ann:pa:ss");
        assert_eq!(
            credentials(Some(format!("Basic {basic}").as_bytes())),
            Ok(Credentials::Basic {
                user: "ann".into(),
                password: "pa:ss".into()
            })
        );
        assert_eq!(
            credentials(Some(b"bearer abc")),
            Ok(Credentials::Bearer("abc".into()))
        );
        for bad in [
            None,
            Some(&b"Basic !!!"[..]),
            Some(b"Bearer "),
            Some(b"Digest x"),
            Some(b"\xff"),
        ] {
            assert_eq!(
                credentials(bad).map_err(|e| e.code),
                Err(ErrorCode::Unauthenticated),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn sasl_plain_gives_a_user_and_password_or_a_token() {
        assert_eq!(
            sasl_plain(b"\0ann\0secret").expect("plain"),
            Credentials::Basic {
                user: "ann".into(),
                password: "secret".into()
            }
        );
        assert_eq!(
            sasl_plain(b"ann\0ann\0a:b\0"),
            Err(unauthenticated(
                "the SASL PLAIN message is not identity NUL user NUL password"
            ))
        );
        assert_eq!(
            sasl_plain(b"ann\0ann\0p").expect("identity is the user"),
            Credentials::Basic {
                user: "ann".into(),
                password: "p".into()
            }
        );
        assert_eq!(
            sasl_plain(b"\0token\0nrd_abc").expect("token"),
            Credentials::Bearer("nrd_abc".into())
        );
        for bad in [
            &b"bob\0ann\0p"[..],
            b"\0ann\0",
            b"\0\0p",
            b"ann",
            b"\0ann\0\xff",
        ] {
            let error = sasl_plain(bad).expect_err("refused");
            assert_eq!(error.code, ErrorCode::Unauthenticated, "{bad:?}");
        }
    }

    #[test]
    fn a_password_verifies_against_its_hash_only() {
        let hash = hash_password("s3cret").expect("hash");
        assert!(hash.starts_with("$argon2id$"), "{hash}");
        assert!(verify_password(&hash, "s3cret"));
        assert!(!verify_password(&hash, "s3cret "));
        assert!(!verify_password("not a hash", "s3cret"));
        assert_ne!(hash, hash_password("s3cret").expect("hash"), "salted");
    }

    #[test]
    fn a_token_acts_as_its_user_while_both_exist() {
        let mut state = state_with("ann", vec![]);
        let token = new_token().expect("token");
        assert!(!token.token.contains(&token.secret_hash));
        state.tokens.insert(
            token.id.clone(),
            Token {
                user: "ann".into(),
                secret_hash: token.secret_hash.clone(),
                created_at_ms: 0,
            },
        );
        assert_eq!(token_user(&state, &token.token), Some("ann"));
        let last = if token.token.ends_with('0') { '1' } else { '0' };
        let forged = format!("{}{last}", &token.token[..token.token.len() - 1]);
        assert_eq!(token_user(&state, &forged), None);
        assert_eq!(token_user(&state, "nrd_nothing"), None);
        state.users.remove("ann");
        assert_eq!(token_user(&state, &token.token), None);
    }

    #[test]
    fn grants_match_names_and_prefixes_and_admin_holds_all() {
        let state = state_with(
            "ann",
            vec![
                Grant {
                    topic: "orders".into(),
                    actions: vec![Action::Produce],
                },
                Grant {
                    topic: "billing.*".into(),
                    actions: vec![Action::Admin, Action::Consume],
                },
            ],
        );
        assert!(allows(&state, "ann", Action::Produce, Some("orders")));
        assert!(!allows(&state, "ann", Action::Produce, Some("orders2")));
        assert!(!allows(&state, "ann", Action::Consume, Some("orders")));
        assert!(allows(&state, "ann", Action::Admin, Some("billing.eu")));
        assert!(!allows(&state, "ann", Action::Cluster, None));
        assert!(!allows(&state, "bob", Action::Produce, Some("orders")));
        assert!(allows(&state, ADMIN_USER, Action::Cluster, None));
        assert!(sees(&state, "ann", "billing.x") && !sees(&state, "ann", "audit"));
    }

    #[test]
    fn grant_lists_are_checked() {
        let grant = |topic: &str, actions: Vec<Action>| Grant {
            topic: topic.into(),
            actions,
        };
        assert!(validate_grants(&[
            grant("orders", vec![Action::Produce]),
            grant("billing.*", vec![Action::Admin]),
            grant("*", vec![Action::Cluster]),
        ])
        .is_ok());
        for bad in [
            grant("a*b", vec![Action::Produce]),
            grant("a b", vec![Action::Produce]),
            grant("orders", vec![]),
            grant("orders", vec![Action::Cluster]),
            grant("**", vec![Action::Produce]),
        ] {
            assert!(
                validate_grants(std::slice::from_ref(&bad)).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_remembered_password_ends_when_the_hash_changes() {
        let verified = VerifiedPasswords::default();
        verified.remember("ann", "pw", "hash-1");
        assert!(verified.known("ann", "pw", "hash-1"));
        assert!(!verified.known("ann", "pw", "hash-2"));
        assert!(!verified.known("ann", "other", "hash-1"));
        assert!(!verified.known("bob", "pw", "hash-1"));
    }
}

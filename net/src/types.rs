//! Request parsing and response bodies of the data plane and topic admin.
//!
//! Requests are parsed field by field from a JSON object (whatever the
//! `Content-Type`), so that every error names its field: a value of the wrong
//! type or out of range is 400 `invalid_request` (never clamped), a field the
//! endpoint does not know is 400 `unknown_field`.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{ApiError, ErrorCode};
use crate::value::{value_json_len, write_hex_u128, write_str, write_u64, write_value_field};
use bytes::Bytes;

/// Limits of the HTTP API (docs/http-api.md).
pub const CONSUME_MAX_MESSAGES_MAX: u64 = 1000;
pub const CONSUME_WAIT_MS_MAX: u64 = 20_000;
pub const VISIBILITY_TIMEOUT_MS_MAX: u64 = 43_200_000;
pub const RECEIPTS_PER_BATCH_MAX: usize = 1000;
pub const TOPIC_PARTITIONS_MAX: u64 = 1024;
pub const RETENTION_MS_MIN: u64 = 3_600_000;
pub const NACK_DELAY_MS_MAX: u64 = VISIBILITY_TIMEOUT_MS_MAX;
/// The longest idempotency window a topic may have: one day.
pub const IDEMPOTENCY_WINDOW_MS_MAX: u64 = 86_400_000;

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message)
}

/// The fields of a JSON object body, taken one by one.
#[derive(Debug)]
pub struct Fields {
    map: Map<String, Value>,
}

impl Fields {
    /// Parses a body that must be a JSON object; an empty body is `{}`.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self { map: Map::new() });
        }
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => Ok(Self { map }),
            Ok(_) => Err(invalid("the body must be a JSON object")),
            Err(error) => Err(invalid(format!("the body is not valid JSON: {error}"))),
        }
    }

    /// An optional unsigned integer within `min..=max`.
    pub fn u64_in(&mut self, name: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
        match self.map.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
                _ => Err(invalid(format!(
                    "{name} must be an integer from {min} to {max}, got {n}"
                ))),
            },
            Some(other) => Err(invalid(format!(
                "{name} must be an integer from {min} to {max}, got {other}"
            ))),
        }
    }

    /// An optional string; `Some(None)` when the field is an explicit null.
    pub fn nullable_string(&mut self, name: &str) -> Result<Option<Option<String>>, ApiError> {
        match self.map.remove(name) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            Some(Value::String(s)) => Ok(Some(Some(s))),
            Some(other) => Err(invalid(format!(
                "{name} must be a string or null, got {other}"
            ))),
        }
    }

    /// A required string.
    pub fn required_string(&mut self, name: &str) -> Result<String, ApiError> {
        match self.map.remove(name) {
            Some(Value::String(s)) => Ok(s),
            None | Some(Value::Null) => Err(invalid(format!("{name} is required"))),
            Some(other) => Err(invalid(format!("{name} must be a string, got {other}"))),
        }
    }

    /// A required array of 1..=`max` strings.
    /// An optional array of 0 to `max` strings; absent or null is `None`.
    pub fn optional_string_array(
        &mut self,
        name: &str,
        max: usize,
    ) -> Result<Option<Vec<String>>, ApiError> {
        match self.map.get(name) {
            None | Some(Value::Null) => {
                self.map.remove(name);
                Ok(None)
            }
            Some(Value::Array(items)) if items.is_empty() => {
                self.map.remove(name);
                Ok(Some(Vec::new()))
            }
            Some(_) => self.string_array(name, max).map(Some),
        }
    }

    pub fn string_array(&mut self, name: &str, max: usize) -> Result<Vec<String>, ApiError> {
        let items = match self.map.remove(name) {
            Some(Value::Array(items)) => items,
            None | Some(Value::Null) => return Err(invalid(format!("{name} is required"))),
            Some(other) => {
                return Err(invalid(format!(
                    "{name} must be an array of strings, got {other}"
                )))
            }
        };
        if items.is_empty() || items.len() > max {
            return Err(invalid(format!(
                "{name} must hold 1 to {max} items, got {}",
                items.len()
            )));
        }
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s),
                other => Err(invalid(format!(
                    "{name}[{i}] must be a string, got {other}"
                ))),
            })
            .collect()
    }

    /// Takes a raw field (for bodies with nested structure).
    pub fn take(&mut self, name: &str) -> Option<Value> {
        self.map.remove(name)
    }

    /// Refuses any field not taken: 400 `unknown_field` naming it.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(name) => Err(ApiError::new(
                ErrorCode::UnknownField,
                format!("unknown field {name:?}"),
            )),
        }
    }
}

/// `POST /v1/topics/{topic}/consume`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumeRequest {
    pub max_messages: u32,
    pub wait_ms: u64,
    pub visibility_timeout_ms: Option<u64>,
    pub partition: Option<u32>,
}

/// A consume's body: what to lease, and the receipts to ack before leasing
/// (`ack`; `None` when the body has no `ack` field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumeBody {
    pub request: ConsumeRequest,
    pub ack: Option<Vec<String>>,
}

impl ConsumeBody {
    /// Parses the body; the partition's upper bound is checked by the caller,
    /// which knows the topic.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let mut fields = Fields::parse(body)?;
        let ack = fields.optional_string_array("ack", RECEIPTS_PER_BATCH_MAX)?;
        let request = ConsumeRequest::from_fields(&mut fields)?;
        fields.finish()?;
        Ok(Self { request, ack })
    }
}

impl ConsumeRequest {
    fn from_fields(fields: &mut Fields) -> Result<Self, ApiError> {
        let max_messages = fields
            .u64_in("max_messages", 1, CONSUME_MAX_MESSAGES_MAX)?
            .unwrap_or(1);
        let wait_ms = fields
            .u64_in("wait_ms", 0, CONSUME_WAIT_MS_MAX)?
            .unwrap_or(0);
        let visibility_timeout_ms =
            fields.u64_in("visibility_timeout_ms", 1, VISIBILITY_TIMEOUT_MS_MAX)?;
        let partition = fields.u64_in("partition", 0, TOPIC_PARTITIONS_MAX - 1)?;
        Ok(Self {
            max_messages: u32::try_from(max_messages).unwrap_or(1),
            wait_ms,
            visibility_timeout_ms,
            partition: partition.and_then(|p| u32::try_from(p).ok()),
        })
    }
}

/// What an ack, nack or extend carries besides its receipt(s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum SettleAction {
    Ack,
    Nack { delay_ms: u64 },
    Extend { visibility_timeout_ms: u64 },
}

/// The single and batch forms of ack, nack and extend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleRequest {
    pub receipts: Vec<String>,
    pub action: SettleAction,
}

/// Which of the three settle endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleKind {
    Ack,
    Nack,
    Extend,
}

impl SettleRequest {
    pub fn parse(body: &[u8], kind: SettleKind, batch: bool) -> Result<Self, ApiError> {
        let mut fields = Fields::parse(body)?;
        let receipts = if batch {
            fields.string_array("receipts", RECEIPTS_PER_BATCH_MAX)?
        } else {
            vec![fields.required_string("receipt")?]
        };
        let action = match kind {
            SettleKind::Ack => SettleAction::Ack,
            SettleKind::Nack => SettleAction::Nack {
                delay_ms: fields
                    .u64_in("delay_ms", 0, NACK_DELAY_MS_MAX)?
                    .unwrap_or(0),
            },
            SettleKind::Extend => SettleAction::Extend {
                visibility_timeout_ms: fields
                    .u64_in("visibility_timeout_ms", 1, VISIBILITY_TIMEOUT_MS_MAX)?
                    .ok_or_else(|| invalid("visibility_timeout_ms is required"))?,
            },
        };
        fields.finish()?;
        Ok(Self { receipts, action })
    }
}

/// `PUT /v1/topics/{topic}`: the fields given (others keep their values).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicPatch {
    pub partitions: Option<u32>,
    pub visibility_timeout_ms: Option<u64>,
    pub retention_ms: Option<u64>,
    pub max_deliveries: Option<u32>,
    pub dead_letter_topic: Option<Option<String>>,
    pub schema: Option<Option<String>>,
    pub max_message_bytes: Option<u64>,
    pub idempotency_window_ms: Option<u64>,
}

impl TopicPatch {
    /// Parses a topic body. `retention_floor_ms` is the one-hour floor, which
    /// only tests lower.
    pub fn parse(
        body: &[u8],
        retention_floor_ms: u64,
        max_message_bytes_max: u64,
    ) -> Result<Self, ApiError> {
        let mut fields = Fields::parse(body)?;
        let partitions = fields.u64_in("partitions", 1, TOPIC_PARTITIONS_MAX)?;
        let visibility_timeout_ms =
            fields.u64_in("visibility_timeout_ms", 1, VISIBILITY_TIMEOUT_MS_MAX)?;
        let retention_ms = fields.u64_in("retention_ms", 0, u64::MAX)?;
        if let Some(r) = retention_ms {
            if r != 0 && r < retention_floor_ms {
                return Err(invalid(format!(
                    "retention_ms must be 0 (forever) or at least {retention_floor_ms}, got {r}"
                )));
            }
        }
        let max_deliveries = fields.u64_in("max_deliveries", 0, u64::from(u32::MAX))?;
        let dead_letter_topic = fields.nullable_string("dead_letter_topic")?;
        let schema = fields.nullable_string("schema")?;
        let max_message_bytes = fields.u64_in("max_message_bytes", 1, max_message_bytes_max)?;
        let idempotency_window_ms =
            fields.u64_in("idempotency_window_ms", 0, IDEMPOTENCY_WINDOW_MS_MAX)?;
        fields.finish()?;
        Ok(Self {
            partitions: partitions.and_then(|p| u32::try_from(p).ok()),
            visibility_timeout_ms,
            retention_ms,
            max_deliveries: max_deliveries.and_then(|d| u32::try_from(d).ok()),
            dead_letter_topic,
            schema,
            max_message_bytes,
            idempotency_window_ms,
        })
    }
}

/// The kinds of child `PUT /v1/topics/{parent}/children/{child}` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildKindName {
    Fanout,
    Delay { delay_ms: u64 },
    Replica,
    Remote(RemoteRequest),
}

/// The `remote` object of a remote child: a topic of another cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteRequest {
    /// `http://HOST:PORT` or `https://HOST:PORT`, without a trailing `/`.
    pub url: String,
    pub topic: String,
    pub token: Option<String>,
    pub rate_bytes_per_s: Option<u64>,
}

impl std::fmt::Debug for RemoteRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteRequest")
            .field("url", &self.url)
            .field("topic", &self.topic)
            .field("token", &self.token.as_ref().map(|_| "(hidden)"))
            .field("rate_bytes_per_s", &self.rate_bytes_per_s)
            .finish()
    }
}

/// The longest remote URL and token a remote child takes.
pub const REMOTE_URL_BYTES_MAX: usize = 2048;
pub const REMOTE_TOKEN_BYTES_MAX: usize = 4096;

impl RemoteRequest {
    fn parse(value: Value) -> Result<Self, ApiError> {
        let Value::Object(map) = value else {
            return Err(invalid(format!("remote must be an object, got {value}")));
        };
        let mut fields = Fields { map };
        let url = fields
            .required_string("url")
            .map_err(|e| ApiError::new(e.code, format!("remote.{}", e.message)))?;
        let topic = fields
            .required_string("topic")
            .map_err(|e| ApiError::new(e.code, format!("remote.{}", e.message)))?;
        let token = fields
            .nullable_string("token")
            .map_err(|e| ApiError::new(e.code, format!("remote.{}", e.message)))?
            .flatten();
        let rate_bytes_per_s = fields
            .u64_in("rate_bytes_per_s", 1, u64::MAX)
            .map_err(|e| ApiError::new(e.code, format!("remote.{}", e.message)))?;
        fields
            .finish()
            .map_err(|e| ApiError::new(e.code, format!("remote: {}", e.message)))?;
        let url = remote_url(&url)?;
        if !crate::names::is_valid_topic_name(&topic) {
            return Err(invalid(format!(
                "remote.topic {:?} is not a topic name: 1 to {} characters of A-Z, a-z, 0-9, '.', '_' or '-'",
                topic.chars().take(64).collect::<String>(),
                crate::names::TOPIC_NAME_BYTES_MAX
            )));
        }
        if let Some(token) = &token {
            let printable = token.bytes().all(|b| b.is_ascii_graphic());
            if token.is_empty() || token.len() > REMOTE_TOKEN_BYTES_MAX || !printable {
                return Err(invalid(format!(
                    "remote.token must be 1 to {REMOTE_TOKEN_BYTES_MAX} printable ASCII characters without spaces (a bearer token of the remote cluster); leave it out for a remote without auth"
                )));
            }
        }
        Ok(Self {
            url,
            topic,
            token,
            rate_bytes_per_s,
        })
    }
}

/// A remote child's URL, checked: `http://` or `https://`, a host and an
/// optional port, nothing after them.
fn remote_url(url: &str) -> Result<String, ApiError> {
    let trimmed = url.trim_end_matches('/');
    let rest = trimmed
        .strip_prefix("https://")
        .or_else(|| trimmed.strip_prefix("http://"));
    let well_formed = rest.is_some_and(|rest| {
        let (host, port) = match rest.rsplit_once(':') {
            // An IPv6 literal without a port ends with `]`.
            Some((host, port)) if !port.ends_with(']') => (host, Some(port)),
            _ => (rest, None),
        };
        !host.is_empty()
            && host.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'[' | b']' | b':')
            })
            && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
    });
    if !well_formed || url.len() > REMOTE_URL_BYTES_MAX {
        let shown: String = url.chars().take(80).collect();
        return Err(invalid(format!(
            "remote.url must look like https://HOST:PORT (or http://HOST:PORT), without a path; got {shown:?}"
        )));
    }
    Ok(trimmed.to_string())
}

/// `PUT /v1/topics/{parent}/children/{child}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRequest {
    pub kind: ChildKindName,
    /// The child topic's settings, as `PUT /v1/topics` takes them.
    pub topic: TopicPatch,
}

/// The longest delay a delay child takes (a year).
pub const CHILD_DELAY_MS_MAX: u64 = 365 * 24 * 3_600_000;

impl ChildRequest {
    pub fn parse(
        body: &[u8],
        retention_floor_ms: u64,
        max_message_bytes_max: u64,
    ) -> Result<Self, ApiError> {
        let mut fields = Fields::parse(body)?;
        let kind = fields.required_string("kind")?;
        let delay_ms = fields.u64_in("delay_ms", 1, CHILD_DELAY_MS_MAX)?;
        let remote = fields.take("remote");
        let topic_field = fields.take("topic");
        let topic_given = topic_field.as_ref().is_some_and(|t| !t.is_null());
        let topic = match topic_field {
            None | Some(Value::Null) => TopicPatch::default(),
            Some(value @ Value::Object(_)) => {
                let bytes =
                    serde_json::to_vec(&value).map_err(|e| invalid(format!("topic: {e}")))?;
                TopicPatch::parse(&bytes, retention_floor_ms, max_message_bytes_max)
                    .map_err(|e| ApiError::new(e.code, format!("topic: {}", e.message)))?
            }
            Some(other) => return Err(invalid(format!("topic must be an object, got {other}"))),
        };
        fields.finish()?;
        let kind = match (kind.as_str(), delay_ms) {
            ("fanout", None) => ChildKindName::Fanout,
            ("replica", None) => ChildKindName::Replica,
            ("delay", Some(delay_ms)) => ChildKindName::Delay { delay_ms },
            ("delay", None) => return Err(invalid("a delay child needs delay_ms")),
            ("fanout" | "replica" | "remote", Some(_)) => {
                return Err(invalid(format!(
                    "delay_ms is only for a delay child, not {kind}"
                )))
            }
            ("remote", None) => {
                let Some(remote) = remote.filter(|r| !r.is_null()) else {
                    return Err(invalid(
                        "a remote child needs remote: {\"url\": \"https://HOST:PORT\", \"topic\": \"name\", \"token\": \"...\"}",
                    ));
                };
                if topic_given {
                    return Err(invalid(
                        "a remote child has no topic here: its messages go to remote.topic on the remote cluster, whose settings are that cluster's",
                    ));
                }
                return Ok(Self {
                    kind: ChildKindName::Remote(RemoteRequest::parse(remote)?),
                    topic,
                });
            }
            (other, _) => {
                return Err(invalid(format!(
                    "kind must be fanout, delay, replica or remote, got {other:?}"
                )))
            }
        };
        if remote.is_some_and(|r| !r.is_null()) {
            return Err(invalid("remote is only for a remote child"));
        }
        Ok(Self { kind, topic })
    }
}

/// `POST /v1/topics/{dlq}/redrive`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveRequest {
    pub to: String,
    pub rate_per_s: Option<u64>,
    pub max_messages: Option<u64>,
}

/// The fastest rate a redrive takes, in messages per second.
pub const REDRIVE_RATE_PER_S_MAX: u64 = 1_000_000;

impl RedriveRequest {
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let mut fields = Fields::parse(body)?;
        let to = fields.required_string("to")?;
        let rate_per_s = fields.u64_in("rate_per_s", 1, REDRIVE_RATE_PER_S_MAX)?;
        let max_messages = fields.u64_in("max_messages", 1, u64::MAX)?;
        fields.finish()?;
        Ok(Self {
            to,
            rate_per_s,
            max_messages,
        })
    }
}

/// `202` of a single produce.
#[derive(Debug, Clone, Serialize)]
pub struct ProduceResponse {
    pub id: String,
}

/// `202` of a batch produce; `ids[i]` belongs to `messages[i]`.
#[derive(Debug, Clone, Serialize)]
pub struct BatchProduceResponse {
    pub ids: Vec<String>,
}

/// One consumed message: what the HTTP API answers (its JSON or binary
/// shape is made at the edge), and what an owner sends the shard that
/// asked for it.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ConsumedMessage {
    pub id: u128,
    pub partition: u32,
    pub offset: u64,
    pub key: Option<Vec<u8>>,
    /// The message's bytes: `value` in JSON when they are UTF-8,
    /// `value_base64` otherwise.
    pub value: Bytes,
    pub receipt: String,
    pub delivery_count: u32,
    pub produced_at_ms: u64,
    pub lease_expires_at_ms: u64,
}

/// How a message stands at its owner when a browse or a search looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum MessageState {
    /// Not acked and not out on a lease: a consume may get it (now, or once
    /// a nack's delay ends).
    Available,
    /// Out on a lease that has not ended.
    Leased,
    Acked,
}

impl MessageState {
    /// Its name in the API.
    pub fn label(self) -> &'static str {
        match self {
            MessageState::Available => "available",
            MessageState::Leased => "leased",
            MessageState::Acked => "acked",
        }
    }
}

/// One message as a browse or a search shows it: where it is, what it
/// holds and how it stands, with no lease and no receipt.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct BrowsedMessage {
    pub id: u128,
    pub partition: u32,
    pub offset: u64,
    pub key: Option<Vec<u8>>,
    pub value: Bytes,
    pub produced_at_ms: u64,
    pub state: MessageState,
    /// Deliveries since the owner last started (an acked message's count
    /// is not kept: 0).
    pub delivery_count: u32,
}

/// A page of one partition's messages, read at its owner.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct BrowsePage {
    pub messages: Vec<BrowsedMessage>,
    /// Where the next page starts.
    pub next_offset: u64,
    pub frontier: u64,
    pub high_watermark: u64,
}

/// Appends one browsed message as the API writes it.
fn write_browsed(out: &mut Vec<u8>, m: &BrowsedMessage) {
    out.extend_from_slice(b"{\"id\":\"");
    write_hex_u128(out, m.id);
    out.extend_from_slice(b"\",\"partition\":");
    write_u64(out, u64::from(m.partition));
    out.extend_from_slice(b",\"offset\":");
    write_u64(out, m.offset);
    if let Some(key) = &m.key {
        out.extend_from_slice(b",\"key\":");
        write_str(out, &String::from_utf8_lossy(key));
    }
    out.push(b',');
    write_value_field(out, &m.value);
    out.extend_from_slice(b",\"produced_at_ms\":");
    write_u64(out, m.produced_at_ms);
    out.extend_from_slice(b",\"state\":\"");
    out.extend_from_slice(m.state.label().as_bytes());
    out.extend_from_slice(b"\",\"delivery_count\":");
    write_u64(out, u64::from(m.delivery_count));
    out.push(b'}');
}

/// Appends `"messages":[...]`.
fn write_browsed_list(out: &mut Vec<u8>, messages: &[BrowsedMessage]) {
    out.extend_from_slice(b"\"messages\":[");
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_browsed(out, m);
    }
    out.push(b']');
}

fn browsed_bytes(messages: &[BrowsedMessage]) -> usize {
    messages
        .iter()
        .map(|m| 200 + m.key.as_ref().map_or(0, |k| k.len() * 6) + value_json_len(&m.value))
        .sum::<usize>()
        + 100
}

/// The answer to a browse: `{"messages": [...], "next_offset",
/// "frontier", "high_watermark"}`.
pub fn browse_response_json(page: &BrowsePage) -> Vec<u8> {
    let mut out = Vec::with_capacity(browsed_bytes(&page.messages));
    out.push(b'{');
    write_browsed_list(&mut out, &page.messages);
    for (name, value) in [
        ("next_offset", page.next_offset),
        ("frontier", page.frontier),
        ("high_watermark", page.high_watermark),
    ] {
        out.extend_from_slice(b",\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        write_u64(&mut out, value);
    }
    out.push(b'}');
    out
}

/// The answer to a search: `{"messages": [...], "cursor": "..." | null}`.
pub fn search_response_json(messages: &[BrowsedMessage], cursor: Option<&str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(browsed_bytes(messages));
    out.push(b'{');
    write_browsed_list(&mut out, messages);
    out.extend_from_slice(b",\"cursor\":");
    match cursor {
        Some(cursor) => write_str(&mut out, cursor),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
    out
}

/// The media type of the binary consume answer: a client that sends it in
/// `Accept` gets each message's fields and bytes length-prefixed, with
/// nothing to escape or parse (docs/http-api.md, "Consume").
pub const MESSAGES_MEDIA_TYPE: &str = "application/vnd.narad.messages";

/// In the binary consume answer, the key length of a message without a key.
pub const BINARY_NO_KEY: u32 = u32::MAX;

/// Whether an `Accept` header asks for [`MESSAGES_MEDIA_TYPE`]: one of its
/// comma-separated entries names it with a `q` above 0 (or none). JSON is
/// the default.
pub fn accepts_binary_messages(accept: Option<&[u8]>) -> bool {
    let Some(accept) = accept.and_then(|a| std::str::from_utf8(a).ok()) else {
        return false;
    };
    accept.split(',').any(|entry| {
        let mut parts = entry.split(';');
        let media = parts.next().unwrap_or("").trim();
        let refused = parts.any(|param| {
            let (name, value) = param.split_once('=').unwrap_or((param, ""));
            name.trim().eq_ignore_ascii_case("q")
                && value.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
        });
        media.eq_ignore_ascii_case(MESSAGES_MEDIA_TYPE) && !refused
    })
}

/// `200` of a consume: `{"messages": [...]}`, written in one buffer sized
/// for it (see [`crate::value`]), and `"acks": [...]` when the consume
/// carried an `ack` list (one result per receipt, as the batch ack has them).
pub fn consume_response_json(
    topic: &str,
    messages: &[ConsumedMessage],
    acks: Option<&[SettleResult]>,
) -> Vec<u8> {
    /// Names, punctuation, id and numbers of one message.
    const FIELDS_BYTES: usize = 240;
    let size = messages
        .iter()
        .map(|m| {
            FIELDS_BYTES
                + topic.len()
                + m.receipt.len()
                + m.key.as_ref().map_or(0, |k| k.len() + 8)
                + value_json_len(&m.value)
        })
        .sum::<usize>()
        + 16;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(b"{\"messages\":[");
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":\"");
        write_hex_u128(&mut out, m.id);
        out.extend_from_slice(b"\",\"topic\":");
        write_str(&mut out, topic);
        out.extend_from_slice(b",\"partition\":");
        write_u64(&mut out, u64::from(m.partition));
        out.extend_from_slice(b",\"offset\":");
        write_u64(&mut out, m.offset);
        if let Some(key) = &m.key {
            out.extend_from_slice(b",\"key\":");
            write_str(&mut out, &String::from_utf8_lossy(key));
        }
        out.push(b',');
        write_value_field(&mut out, &m.value);
        out.extend_from_slice(b",\"receipt\":");
        write_str(&mut out, &m.receipt);
        out.extend_from_slice(b",\"delivery_count\":");
        write_u64(&mut out, u64::from(m.delivery_count));
        out.extend_from_slice(b",\"produced_at_ms\":");
        write_u64(&mut out, m.produced_at_ms);
        out.extend_from_slice(b",\"lease_expires_at_ms\":");
        write_u64(&mut out, m.lease_expires_at_ms);
        out.push(b'}');
    }
    out.push(b']');
    if let Some(acks) = acks {
        out.extend_from_slice(b",\"acks\":");
        // Results are a few small fields each; serde writes them.
        if serde_json::to_writer(&mut out, acks).is_err() {
            out.extend_from_slice(b"[]");
        }
    }
    out.push(b'}');
    out
}

/// Bytes of one message in the binary answer besides its receipt, key and
/// value: id, partition, offset, delivery count, two times and three
/// lengths.
const BINARY_FIXED_BYTES: usize = 16 + 4 + 8 + 4 + 8 + 8 + 2 + 4 + 4;

/// `200` of a consume in [`MESSAGES_MEDIA_TYPE`]: a message count, then
/// each message's fields, all integers big-endian, then the acks' results
/// when the consume carried an `ack` list (in its order):
///
/// ```text
/// answer  = count u32 | message* [ acks ]
/// message = id [16] | partition u32 | offset u64 | delivery_count u32
///         | produced_at_ms u64 | lease_expires_at_ms u64
///         | receipt_len u16 | receipt | key_len u32 | key | value_len u32 | value
/// acks    = count u32 | ack*
/// ack     = status u16 | error_len u32 | error (the JSON error object; empty on success)
/// ```
/// `key_len` is [`BINARY_NO_KEY`] for a message without a key.
pub fn consume_response_binary(
    messages: &[ConsumedMessage],
    acks: Option<&[SettleResult]>,
) -> Vec<u8> {
    let size = messages
        .iter()
        .map(|m| {
            BINARY_FIXED_BYTES
                + m.receipt.len()
                + m.key.as_ref().map_or(0, Vec::len)
                + m.value.len()
        })
        .sum::<usize>()
        + 4;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&len_u32(messages.len()).to_be_bytes());
    for m in messages {
        out.extend_from_slice(&m.id.to_be_bytes());
        out.extend_from_slice(&m.partition.to_be_bytes());
        out.extend_from_slice(&m.offset.to_be_bytes());
        out.extend_from_slice(&m.delivery_count.to_be_bytes());
        out.extend_from_slice(&m.produced_at_ms.to_be_bytes());
        out.extend_from_slice(&m.lease_expires_at_ms.to_be_bytes());
        // Receipts are at most a few hundred characters (base64 of a
        // topic name and a few numbers).
        let receipt = m.receipt.as_bytes();
        let receipt = &receipt[..receipt.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(receipt.len() as u16).to_be_bytes());
        out.extend_from_slice(receipt);
        match &m.key {
            Some(key) => {
                out.extend_from_slice(&len_u32(key.len()).to_be_bytes());
                out.extend_from_slice(key);
            }
            None => out.extend_from_slice(&BINARY_NO_KEY.to_be_bytes()),
        }
        out.extend_from_slice(&len_u32(m.value.len()).to_be_bytes());
        out.extend_from_slice(&m.value);
    }
    if let Some(acks) = acks {
        out.extend_from_slice(&len_u32(acks.len()).to_be_bytes());
        for ack in acks {
            out.extend_from_slice(&ack.status.to_be_bytes());
            let error = ack
                .error
                .as_ref()
                .and_then(|e| serde_json::to_vec(e).ok())
                .unwrap_or_default();
            out.extend_from_slice(&len_u32(error.len()).to_be_bytes());
            out.extend_from_slice(&error);
        }
    }
    out
}

/// A length that fits the binary answer's u32 (messages, keys and values
/// are bounded far below it).
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX - 1)
}

/// A binary consume answer, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryConsumeAnswer {
    pub messages: Vec<ConsumedMessage>,
    /// The results of the consume's `ack` list, in its order; `None` when
    /// it carried none.
    pub acks: Option<Vec<AckOutcome>>,
}

/// What one receipt of a consume's `ack` list came to: the status a single
/// ack would have answered, and its error object unless it landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckOutcome {
    pub status: u16,
    pub error: Option<Value>,
}

/// Bytes of one ack result in the binary answer besides its error.
const BINARY_ACK_FIXED_BYTES: usize = 2 + 4;

/// Reads a binary consume answer ([`consume_response_binary`]); the value
/// of each message is a slice of `body`, not a copy. An answer cut short or
/// with bytes left over is an error naming where.
pub fn parse_consume_binary(body: &Bytes) -> Result<BinaryConsumeAnswer, String> {
    let at = std::cell::Cell::new(0usize);
    let take = |len: usize| -> Result<std::ops::Range<usize>, String> {
        let start = at.get();
        let end = start
            .checked_add(len)
            .filter(|end| *end <= body.len())
            .ok_or_else(|| {
                format!(
                    "the answer ends at byte {} inside a field at byte {start}",
                    body.len()
                )
            })?;
        at.set(end);
        Ok(start..end)
    };
    fn array<const N: usize>(body: &[u8], range: std::ops::Range<usize>) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&body[range]);
        out
    }
    let count = u32::from_be_bytes(array(body, take(4)?));
    // Each message takes at least its fixed bytes: a count larger than the
    // body could hold is refused before anything is allocated for it.
    if count as usize > body.len() / BINARY_FIXED_BYTES {
        return Err(format!(
            "the answer counts {count} messages in {} bytes",
            body.len()
        ));
    }
    let mut messages = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let id = u128::from_be_bytes(array(body, take(16)?));
        let partition = u32::from_be_bytes(array(body, take(4)?));
        let offset = u64::from_be_bytes(array(body, take(8)?));
        let delivery_count = u32::from_be_bytes(array(body, take(4)?));
        let produced_at_ms = u64::from_be_bytes(array(body, take(8)?));
        let lease_expires_at_ms = u64::from_be_bytes(array(body, take(8)?));
        let receipt_len = u16::from_be_bytes(array(body, take(2)?));
        let receipt = std::str::from_utf8(&body[take(usize::from(receipt_len))?])
            .map_err(|_| "a receipt that is not UTF-8".to_string())?
            .to_string();
        let key_len = u32::from_be_bytes(array(body, take(4)?));
        let key = if key_len == BINARY_NO_KEY {
            None
        } else {
            Some(body[take(key_len as usize)?].to_vec())
        };
        let value_len = u32::from_be_bytes(array(body, take(4)?));
        let value = body.slice(take(value_len as usize)?);
        messages.push(ConsumedMessage {
            id,
            partition,
            offset,
            key,
            value,
            receipt,
            delivery_count,
            produced_at_ms,
            lease_expires_at_ms,
        });
    }
    let acks = if at.get() == body.len() {
        None
    } else {
        let count = u32::from_be_bytes(array(body, take(4)?));
        if count as usize > body.len() / BINARY_ACK_FIXED_BYTES {
            return Err(format!(
                "the answer counts {count} ack results in {} bytes",
                body.len()
            ));
        }
        let mut acks = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let status = u16::from_be_bytes(array(body, take(2)?));
            let error_len = u32::from_be_bytes(array(body, take(4)?));
            let error = &body[take(error_len as usize)?];
            let error = if error.is_empty() {
                None
            } else {
                Some(
                    serde_json::from_slice(error)
                        .map_err(|e| format!("an ack result's error is not JSON: {e}"))?,
                )
            };
            acks.push(AckOutcome { status, error });
        }
        Some(acks)
    };
    if at.get() != body.len() {
        return Err(format!(
            "{} bytes after the last ack result",
            body.len() - at.get()
        ));
    }
    Ok(BinaryConsumeAnswer { messages, acks })
}

/// `200` of an extend.
#[derive(Debug, Clone, Serialize)]
pub struct ExtendResponse {
    pub lease_expires_at_ms: u64,
}

/// One result of a batch ack, nack or extend.
#[derive(Debug, Clone, Serialize)]
pub struct SettleResult {
    pub receipt: String,
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SettleBatchResponse {
    pub results: Vec<SettleResult>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn code(result: Result<impl std::fmt::Debug, ApiError>) -> ErrorCode {
        result.expect_err("an error").code
    }

    fn consumed(key: Option<&str>, value: &[u8]) -> ConsumedMessage {
        ConsumedMessage {
            id: 42,
            partition: 3,
            offset: 17,
            key: key.map(|k| k.as_bytes().to_vec()),
            value: Bytes::copy_from_slice(value),
            receipt: "AQID-_x".into(),
            delivery_count: 2,
            produced_at_ms: 1_700_000_000_000,
            lease_expires_at_ms: u64::MAX,
        }
    }

    #[test]
    fn a_browse_answer_is_json_with_each_messages_state_and_no_receipt() {
        let browsed = |key: Option<&str>, value: &[u8], state| BrowsedMessage {
            id: 42,
            partition: 3,
            offset: 17,
            key: key.map(|k| k.as_bytes().to_vec()),
            value: Bytes::copy_from_slice(value),
            produced_at_ms: 1_700_000_000_000,
            state,
            delivery_count: 2,
        };
        let page = BrowsePage {
            messages: vec![
                browsed(Some("k\"1"), b"{\"a\": 1}", MessageState::Leased),
                browsed(None, &[0, 0xff], MessageState::Acked),
                browsed(Some(""), b"", MessageState::Available),
            ],
            next_offset: 18,
            frontier: 5,
            high_watermark: 30,
        };
        let parsed: Value =
            serde_json::from_slice(&browse_response_json(&page)).expect("valid JSON");
        let fields = |state: &str, value: (&str, &str)| {
            let mut m = json!({"id": "0000000000000000000000000000002a", "partition": 3,
                "offset": 17, "produced_at_ms": 1_700_000_000_000_u64, "state": state,
                "delivery_count": 2});
            m[value.0] = json!(value.1);
            m
        };
        let mut first = fields("leased", ("value", "{\"a\": 1}"));
        first["key"] = json!("k\"1");
        let mut third = fields("available", ("value", ""));
        third["key"] = json!("");
        assert_eq!(
            parsed,
            json!({"messages": [first, fields("acked", ("value_base64", "AP8=")), third],
                "next_offset": 18, "frontier": 5, "high_watermark": 30})
        );
    }

    #[test]
    fn a_binary_consume_answer_reads_back_as_written_and_refuses_a_damaged_one() {
        let messages = vec![
            consumed(Some("k\"ey\n"), b"{\"a\": 1}\r\n"),
            consumed(None, &[0, 0xff, 0x80]),
            consumed(Some(""), b""),
        ];
        let acks = [
            SettleResult {
                receipt: "R1".into(),
                status: 204,
                lease_expires_at_ms: None,
                error: None,
            },
            SettleResult {
                receipt: "R2".into(),
                status: 410,
                lease_expires_at_ms: None,
                error: Some(json!({"code": "lease_gone", "message": "the lease ended"})),
            },
        ];
        let body = Bytes::from(consume_response_binary(&messages, Some(&acks)));
        let read = parse_consume_binary(&body).expect("a whole answer");
        assert_eq!(read.messages, messages);
        assert_eq!(
            read.acks,
            Some(vec![
                AckOutcome {
                    status: 204,
                    error: None
                },
                AckOutcome {
                    status: 410,
                    error: acks[1].error.clone()
                },
            ])
        );
        let without = parse_consume_binary(&Bytes::from(consume_response_binary(&messages, None)));
        assert_eq!(
            without.map(|a| (a.messages, a.acks)),
            Ok((messages.clone(), None))
        );
        let empty = parse_consume_binary(&Bytes::from(consume_response_binary(&[], Some(&[]))));
        assert_eq!(
            empty.map(|a| (a.messages, a.acks)),
            Ok((vec![], Some(vec![])))
        );
        // Cut anywhere, or with a byte more, it is refused, never misread;
        // cut just before its acks it reads as an answer without them (the
        // client knows whether it sent any, and checks).
        let messages_end = consume_response_binary(&messages, None).len();
        for cut in 0..body.len() {
            let read = parse_consume_binary(&body.slice(..cut));
            if cut == messages_end {
                assert_eq!(read.map(|a| a.acks), Ok(None));
            } else {
                assert!(read.is_err(), "cut at {cut}");
            }
        }
        let mut longer = body.to_vec();
        longer.push(0);
        assert!(parse_consume_binary(&Bytes::from(longer)).is_err());
        // A count no body could hold allocates nothing.
        assert!(parse_consume_binary(&Bytes::from_static(&[0xff, 0xff, 0xff, 0xff])).is_err());
    }

    #[test]
    fn only_an_accept_that_names_the_binary_type_gets_it() {
        let accepts = |header: &str| accepts_binary_messages(Some(header.as_bytes()));
        assert!(accepts("application/vnd.narad.messages"));
        assert!(accepts(
            "application/json;q=0.5, Application/Vnd.Narad.Messages; q=1"
        ));
        assert!(!accepts("application/json"));
        assert!(!accepts("*/*"));
        assert!(!accepts("application/vnd.narad.messages+json"));
        assert!(!accepts("application/vnd.narad.messages;q=0"));
        assert!(!accepts(
            "application/vnd.narad.messages; q=0.000, application/json"
        ));
        assert!(accepts("application/vnd.narad.messages;q=0.1"));
        assert!(!accepts_binary_messages(None));
    }

    #[test]
    fn a_consume_answer_is_json_with_every_field_of_each_message() {
        assert_eq!(
            consume_response_json("orders", &[], None),
            br#"{"messages":[]}"#
        );
        let gone = SettleResult {
            receipt: "R".into(),
            status: 410,
            lease_expires_at_ms: None,
            error: Some(json!({"code": "lease_gone", "message": "m"})),
        };
        assert_eq!(
            serde_json::from_slice::<Value>(&consume_response_json("orders", &[], Some(&[gone])))
                .ok(),
            Some(
                json!({"messages": [], "acks": [{"receipt": "R", "status": 410,
                "error": {"code": "lease_gone", "message": "m"}}]})
            )
        );
        let messages = [
            consumed(Some("k\"ey\n"), b"{\"a\": \"\x07\"}\r\n"),
            consumed(None, &[0, 0xff, 0x80]),
            consumed(Some(""), "é€😀".as_bytes()),
        ];
        let json = consume_response_json("orders", &messages, None);
        let parsed: Value = serde_json::from_slice(&json).expect("valid JSON");
        let expected = |key: Option<&str>, value: (&str, &str)| {
            let mut message = json!({
                "id": "0000000000000000000000000000002a", "topic": "orders",
                "partition": 3, "offset": 17, "receipt": "AQID-_x", "delivery_count": 2,
                "produced_at_ms": 1_700_000_000_000_u64, "lease_expires_at_ms": u64::MAX,
            });
            if let Some(key) = key {
                message["key"] = json!(key);
            }
            message[value.0] = json!(value.1);
            message
        };
        assert_eq!(
            parsed,
            json!({"messages": [
                expected(Some("k\"ey\n"), ("value", "{\"a\": \"\u{7}\"}\r\n")),
                expected(None, ("value_base64", "AP+A")),
                expected(Some(""), ("value", "é€😀")),
            ]})
        );
        // Fields in the order the API lists them.
        let text = String::from_utf8(json).expect("utf-8");
        assert!(
            text.starts_with(
                r#"{"messages":[{"id":"0000000000000000000000000000002a","topic":"orders","partition":3,"offset":17,"key":"k\"ey\n","value":"{\"a\": \"\u0007\"}\r\n","receipt":"AQID-_x","delivery_count":2,"#
            ),
            "{text}"
        );
    }

    #[test]
    fn consume_defaults_and_bounds() {
        let body = ConsumeBody::parse(b"").expect("empty body");
        assert_eq!(body.ack, None);
        assert_eq!(
            body.request,
            ConsumeRequest {
                max_messages: 1,
                wait_ms: 0,
                visibility_timeout_ms: None,
                partition: None
            }
        );
        let request = ConsumeBody::parse(br#"{"max_messages":1000,"wait_ms":20000,"partition":3}"#)
            .expect("ok")
            .request;
        assert_eq!(
            (request.max_messages, request.wait_ms, request.partition),
            (1000, 20000, Some(3))
        );
        for bad in [
            &br#"{"max_messages":0}"#[..],
            br#"{"max_messages":1001}"#,
            br#"{"wait_ms":20001}"#,
            br#"{"wait_ms":-1}"#,
            br#"{"visibility_timeout_ms":0}"#,
            br#"{"max_messages":"5"}"#,
            br#"{"max_messages":1.5}"#,
            br#"[1]"#,
            br#"{"#,
            br#"{"ack":"R1"}"#,
            br#"{"ack":[1]}"#,
        ] {
            assert_eq!(
                code(ConsumeBody::parse(bad)),
                ErrorCode::InvalidRequest,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            code(ConsumeBody::parse(br#"{"max":5}"#)),
            ErrorCode::UnknownField
        );
    }

    #[test]
    fn a_consume_carries_up_to_a_batch_of_receipts_to_ack_first() {
        let ack = |body: &str| ConsumeBody::parse(body.as_bytes()).map(|b| b.ack);
        assert_eq!(
            ack(r#"{"ack":["R1","R2"]}"#),
            Ok(Some(vec!["R1".into(), "R2".into()]))
        );
        assert_eq!(ack(r#"{"ack":[]}"#), Ok(Some(vec![])));
        assert_eq!(ack(r#"{"ack":null}"#), Ok(None));
        let most = vec!["R"; RECEIPTS_PER_BATCH_MAX];
        assert!(ack(&json!({ "ack": most }).to_string()).is_ok());
        let over = vec!["R"; RECEIPTS_PER_BATCH_MAX + 1];
        let error = ack(&json!({ "ack": over }).to_string()).expect_err("too many");
        assert!(error.message.contains("ack must hold"), "{}", error.message);
    }

    #[test]
    fn settle_requests_parse_single_and_batch() {
        let ack =
            SettleRequest::parse(br#"{"receipt":"r1"}"#, SettleKind::Ack, false).expect("ack");
        assert_eq!(
            ack,
            SettleRequest {
                receipts: vec!["r1".into()],
                action: SettleAction::Ack
            }
        );
        let nack = SettleRequest::parse(
            br#"{"receipts":["a","b"],"delay_ms":50}"#,
            SettleKind::Nack,
            true,
        )
        .expect("nack");
        assert_eq!(nack.action, SettleAction::Nack { delay_ms: 50 });
        assert_eq!(nack.receipts.len(), 2);
        assert_eq!(
            code(SettleRequest::parse(
                br#"{"receipt":"r"}"#,
                SettleKind::Extend,
                false
            )),
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            code(SettleRequest::parse(
                br#"{"receipts":[]}"#,
                SettleKind::Ack,
                true
            )),
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            code(SettleRequest::parse(
                br#"{"receipts":[1]}"#,
                SettleKind::Ack,
                true
            )),
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            code(SettleRequest::parse(br#"{}"#, SettleKind::Ack, false)),
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            code(SettleRequest::parse(
                br#"{"receipt":"r","x":1}"#,
                SettleKind::Ack,
                false
            )),
            ErrorCode::UnknownField
        );
    }

    #[test]
    fn child_requests_name_their_kind_and_refuse_the_rest() {
        let parse = |b: &[u8]| ChildRequest::parse(b, RETENTION_MS_MIN, 1 << 24);
        let child =
            parse(br#"{"kind":"delay","delay_ms":5000,"topic":{"partitions":2}}"#).expect("delay");
        assert_eq!(child.kind, ChildKindName::Delay { delay_ms: 5000 });
        assert_eq!(child.topic.partitions, Some(2));
        assert_eq!(
            parse(br#"{"kind":"fanout"}"#).expect("fanout").kind,
            ChildKindName::Fanout
        );
        for bad in [
            &b""[..],
            br#"{"kind":"delay"}"#,
            br#"{"kind":"fanout","delay_ms":5}"#,
            br#"{"kind":"mirror"}"#,
            br#"{"kind":"fanout","topic":{"partitions":0}}"#,
            br#"{"kind":"fanout","topic":7}"#,
        ] {
            assert_eq!(code(parse(bad)), ErrorCode::InvalidRequest, "{bad:?}");
        }
        let remote = parse(
            br#"{"kind":"remote","remote":{"url":"https://dr.example:8443/","topic":"orders","token":"t0k","rate_bytes_per_s":1000}}"#,
        )
        .expect("remote");
        assert_eq!(
            remote.kind,
            ChildKindName::Remote(RemoteRequest {
                url: "https://dr.example:8443".into(),
                topic: "orders".into(),
                token: Some("t0k".into()),
                rate_bytes_per_s: Some(1000),
            })
        );
        assert!(
            !format!("{remote:?}").contains("t0k"),
            "the token stays hidden"
        );
        let open = parse(br#"{"kind":"remote","remote":{"url":"http://[::1]:7","topic":"o"}}"#)
            .expect("a remote without auth and an IPv6 literal");
        assert!(matches!(
            open.kind,
            ChildKindName::Remote(RemoteRequest { token: None, .. })
        ));
        for (bad, says) in [
            (&br#"{"kind":"remote"}"#[..], "needs remote"),
            (br#"{"kind":"remote","remote":{"url":"https://x:1"}}"#, "remote.topic"),
            (br#"{"kind":"remote","remote":{"topic":"t"}}"#, "remote.url"),
            (br#"{"kind":"remote","remote":{"url":"ftp://x:1","topic":"t"}}"#, "remote.url"),
            (br#"{"kind":"remote","remote":{"url":"https://x:1/v1","topic":"t"}}"#, "remote.url"),
            (br#"{"kind":"remote","remote":{"url":"https://x:0","topic":"t"}}"#, "remote.url"),
            (br#"{"kind":"remote","remote":{"url":"https://x:1","topic":"a/b"}}"#, "remote.topic"),
            (br#"{"kind":"remote","remote":{"url":"https://x:1","topic":"t","token":"a b"}}"#, "remote.token"),
            (br#"{"kind":"remote","remote":{"url":"https://x:1","topic":"t","rate_bytes_per_s":0}}"#, "rate_bytes_per_s"),
            (br#"{"kind":"remote","remote":{"url":"https://x:1","topic":"t"},"topic":{"partitions":2}}"#, "no topic here"),
            (br#"{"kind":"remote","remote":"https://x:1"}"#, "object"),
            (br#"{"kind":"fanout","remote":{"url":"https://x:1","topic":"t"}}"#, "only for a remote"),
        ] {
            let error = parse(bad).expect_err("refused");
            assert_eq!(error.code, ErrorCode::InvalidRequest, "{bad:?}");
            assert!(error.message.contains(says), "{bad:?}: {}", error.message);
        }
        assert_eq!(
            code(parse(
                br#"{"kind":"remote","remote":{"url":"https://x:1","topic":"t","tokn":"x"}}"#
            )),
            ErrorCode::UnknownField
        );
        assert_eq!(
            code(parse(br#"{"kind":"fanout","colour":1}"#)),
            ErrorCode::UnknownField
        );
        assert_eq!(
            code(parse(br#"{"kind":"fanout","topic":{"partitons":1}}"#)),
            ErrorCode::UnknownField
        );
    }

    #[test]
    fn redrive_requests_need_a_target() {
        let request = RedriveRequest::parse(br#"{"to":"orders","rate_per_s":10}"#).expect("ok");
        assert_eq!(request.to, "orders");
        assert_eq!(request.rate_per_s, Some(10));
        assert_eq!(request.max_messages, None);
        assert_eq!(
            code(RedriveRequest::parse(b"{}")),
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            code(RedriveRequest::parse(br#"{"to":"a","rate_per_s":0}"#)),
            ErrorCode::InvalidRequest
        );
    }

    #[test]
    fn topic_patch_validates_every_field() {
        let patch = TopicPatch::parse(
            br#"{"partitions":8,"retention_ms":0,"dead_letter_topic":null}"#,
            RETENTION_MS_MIN,
            1 << 24,
        )
        .expect("ok");
        assert_eq!(patch.partitions, Some(8));
        assert_eq!(patch.dead_letter_topic, Some(None));
        assert_eq!(patch.visibility_timeout_ms, None);
        assert_eq!(
            TopicPatch::parse(b"", RETENTION_MS_MIN, 1 << 24).expect("empty"),
            TopicPatch::default()
        );
        for bad in [
            &br#"{"partitions":0}"#[..],
            br#"{"partitions":1025}"#,
            br#"{"retention_ms":1000}"#,
            br#"{"visibility_timeout_ms":43200001}"#,
            br#"{"dead_letter_topic":5}"#,
        ] {
            assert_eq!(
                code(TopicPatch::parse(bad, RETENTION_MS_MIN, 1 << 24)),
                ErrorCode::InvalidRequest
            );
        }
        let unknown = TopicPatch::parse(br#"{"partitons":3}"#, RETENTION_MS_MIN, 1 << 24)
            .expect_err("unknown");
        assert_eq!(unknown.code, ErrorCode::UnknownField);
        assert!(unknown.message.contains("partitons"));
    }
}

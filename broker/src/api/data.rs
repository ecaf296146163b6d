//! The data plane's handlers: produce, and the settles of leased
//! messages (consume is answered in `dispatch`, beside its settles).

use super::*;

/// `POST /v1/topics/{topic}/messages`: one message, the body its value.
pub(super) async fn produce(
    shard: &Rc<Shard>,
    name: &str,
    headers: &hyper::HeaderMap,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    let topic = shard.topic(name)?;
    let key = produce_key(headers)?;
    let idempotency_key = idempotency_key(headers)?;
    // One exact-size copy: the request's buffer is hyper's read
    // buffer, which the tail cache must not keep alive.
    let value = Bytes::copy_from_slice(body);
    let outcome = shard
        .produce(
            &topic,
            vec![Incoming {
                key,
                value,
                idempotency_key,
                partition: None,
            }],
        )
        .await?;
    let Some(id) = outcome.ids.into_iter().next() else {
        return Err(ApiError::new(
            ErrorCode::Internal,
            "a produce of one message answered no id",
        ));
    };
    let answer = if outcome.duplicates.is_empty() {
        json!({ "id": id })
    } else {
        json!({ "id": id, "duplicate": true })
    };
    Ok(json_response(StatusCode::ACCEPTED, &answer))
}

/// `POST /v1/topics/{topic}/messages/batch`: all or nothing.
pub(super) async fn produce_batch(
    shard: &Rc<Shard>,
    name: &str,
    headers: &hyper::HeaderMap,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    let topic = shard.topic(name)?;
    if headers.contains_key(IDEMPOTENCY_KEY_HEADER) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "the Narad-Idempotency-Key header names one message: give each batch item its idempotency_key instead; nothing was written",
        ));
    }
    let items = parse_batch(body, topic.config.max_message_bytes)?;
    let batch_bytes: usize = items.iter().map(|i| i.value.len()).sum();
    let batch_max = shard.settings().http.max_batch_bytes;
    if batch_bytes as u64 > batch_max {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("the batch holds {batch_bytes} bytes of values, over http.max_batch_bytes of {batch_max}"),
        ));
    }
    let messages = items
        .into_iter()
        .map(|i| Incoming {
            key: i.key.map(String::into_bytes),
            value: Bytes::from(i.value),
            idempotency_key: i.idempotency_key.map(String::into_bytes),
            partition: None,
        })
        .collect();
    let outcome = shard.produce(&topic, messages).await?;
    let answer = if outcome.duplicates.is_empty() {
        json!({ "ids": outcome.ids })
    } else {
        json!({ "ids": outcome.ids, "duplicates": outcome.duplicates })
    };
    Ok(json_response(StatusCode::ACCEPTED, &answer))
}

/// `POST /v1/topics/{topic}/consume`: acks what the body carries first,
/// then leases messages, in JSON or the binary framing as `Accept` asks.
pub(super) async fn consume(
    shard: &Rc<Shard>,
    name: &str,
    headers: &hyper::HeaderMap,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    let topic = shard.topic(name)?;
    let ConsumeBody {
        request: consume,
        ack,
    } = ConsumeBody::parse(body)?;
    shard.check_consume(&topic, &consume)?;
    let binary = accepts_binary_messages(headers.get(hyper::header::ACCEPT).map(|v| v.as_bytes()));
    // Acks first: their leases end before new ones are granted,
    // and a consume dropped while it waits has still acked.
    let acks = match ack {
        Some(receipts) => {
            let answers = shard.settle(&topic, &receipts, SettleAction::Ack).await;
            Some(settle_results(receipts, answers, 204))
        }
        None => None,
    };
    let messages = shard.consume(&topic, consume).await?;
    let (content_type, answer) = if binary {
        (
            MESSAGES_MEDIA_TYPE,
            consume_response_binary(&messages, acks.as_deref()),
        )
    } else {
        (
            "application/json",
            consume_response_json(&topic.name, &messages, acks.as_deref()),
        )
    };
    Ok(bytes_response(StatusCode::OK, content_type, answer))
}

/// The ack, nack and extend routes, one receipt or a batch.
pub(super) async fn settle(
    shard: &Rc<Shard>,
    name: &str,
    kind: SettleKind,
    batch: bool,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    let topic = shard.topic(name)?;
    let settle = SettleRequest::parse(body, kind, batch)?;
    if batch {
        Ok(settle_batch(shard, &topic, settle).await)
    } else {
        settle_one(shard, &topic, settle).await
    }
}

/// The idempotency key of a single produce, from its
/// `Narad-Idempotency-Key` header (checked: 1 to 256 printable ASCII bytes).
pub(super) fn idempotency_key(headers: &hyper::HeaderMap) -> Result<Option<Vec<u8>>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY_HEADER) else {
        return Ok(None);
    };
    check_idempotency_key("the Narad-Idempotency-Key header", value.as_bytes())?;
    Ok(Some(value.as_bytes().to_vec()))
}

/// The header of idempotent produce (lower case, as hyper names headers).
pub(super) const IDEMPOTENCY_KEY_HEADER: &str = "narad-idempotency-key";

/// The key of a single produce, from its `Narad-Key` header: UTF-8 (a key
/// comes back as a JSON string) and at most [`KEY_BYTES_MAX`] bytes.
pub(super) fn produce_key(headers: &hyper::HeaderMap) -> Result<Option<Vec<u8>>, ApiError> {
    let Some(value) = headers.get("narad-key") else {
        return Ok(None);
    };
    let key = std::str::from_utf8(value.as_bytes()).map_err(|_| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            "the Narad-Key header must be UTF-8 text; send a binary key base64-encoded",
        )
    })?;
    if key.len() > KEY_BYTES_MAX {
        return Err(key_too_long("the Narad-Key header", key.len()));
    }
    Ok(Some(key.as_bytes().to_vec()))
}

pub(super) async fn settle_one(
    shard: &Shard,
    topic: &Topic,
    settle: SettleRequest,
) -> Result<HttpResponse, ApiError> {
    let answer = shard
        .settle(
            topic,
            &settle.receipts[..1.min(settle.receipts.len())],
            settle.action,
        )
        .await
        .into_iter()
        .next()
        .unwrap_or_else(|| Err(ApiError::new(ErrorCode::InvalidRequest, "no receipt given")));
    match answer? {
        Some(lease_expires_at_ms) => Ok(json_response(
            StatusCode::OK,
            &ExtendResponse {
                lease_expires_at_ms,
            },
        )),
        None => Ok(empty_response(StatusCode::NO_CONTENT)),
    }
}

pub(super) async fn settle_batch(
    shard: &Shard,
    topic: &Topic,
    settle: SettleRequest,
) -> HttpResponse {
    let ok_status = match settle.action {
        SettleAction::Extend { .. } => 200,
        SettleAction::Ack | SettleAction::Nack { .. } => 204,
    };
    let answers = shard.settle(topic, &settle.receipts, settle.action).await;
    let results = settle_results(settle.receipts, answers, ok_status);
    json_response(StatusCode::OK, &SettleBatchResponse { results })
}

/// One result per receipt, in order, as the batch forms answer them.
pub(super) fn settle_results(
    receipts: Vec<String>,
    answers: crate::rpc::Settled,
    ok_status: u16,
) -> Vec<SettleResult> {
    receipts
        .into_iter()
        .zip(answers)
        .map(|(receipt, answer)| match answer {
            Ok(lease_expires_at_ms) => SettleResult {
                receipt,
                status: ok_status,
                lease_expires_at_ms,
                error: None,
            },
            Err(error) => SettleResult {
                receipt,
                status: error.status(),
                lease_expires_at_ms: None,
                error: serde_json::from_str::<Value>(&error.to_json())
                    .ok()
                    .map(|v| v["error"].clone()),
            },
        })
        .collect()
}

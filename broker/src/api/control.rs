//! The control plane's handlers: topics, children, redrives, schemas,
//! users and grants.

use super::*;

/// A topic that is the dead-letter topic of another cannot be deleted
/// (409); when the user cannot see that other topic, the answer does not
/// name it.
pub(super) fn refuse_if_a_hidden_topic_dead_letters_here(
    shard: &Shard,
    user: &str,
    name: &str,
) -> Result<(), ApiError> {
    let view = shard.state();
    let hidden = view.state.topics.values().any(|t| {
        t.config.dead_letter_topic.as_deref() == Some(name) && !shard.sees_topic(user, &t.name)
    });
    if hidden {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("topic {name:?} is the dead-letter topic of another topic"),
        ));
    }
    Ok(())
}

/// `{schema}` in a path: a topic name's characters.
pub(super) fn validate_schema_name(name: &str) -> Result<(), ApiError> {
    validate_topic_name(name).map_err(|_| {
        let shown: String = name.chars().take(64).collect();
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!("schema name {shown:?} must be 1 to 249 characters of A-Z, a-z, 0-9, '.', '_' or '-'"),
        )
    })
}

pub(super) fn schemas_json(shard: &Shard) -> Value {
    let view = shard.state();
    let schemas: Vec<Value> = view
        .state
        .schemas
        .iter()
        .map(|(name, schema)| json!({"name": name, "version": schema.latest().0}))
        .collect();
    json!({ "schemas": schemas })
}

pub(super) fn no_such(what: &str, name: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("{what} {name:?} does not exist"),
    )
}

pub(super) async fn schema(
    shard: &Shard,
    method: &Method,
    name: &str,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    match *method {
        Method::PUT => {
            let document = check_document(body)?;
            let (version, created) = shard.put_schema(name, document).await?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(
                status,
                &json!({"name": name, "version": version}),
            ))
        }
        Method::DELETE => {
            if !shard.state().state.schemas.contains_key(name) {
                return Err(no_such("schema", name));
            }
            shard.delete_schema(name).await?;
            Ok(empty_response(StatusCode::NO_CONTENT))
        }
        _ => {
            let view = shard.state();
            let schema = view
                .state
                .schemas
                .get(name)
                .ok_or_else(|| no_such("schema", name))?;
            let (version, document) = schema.latest();
            let document: Value = serde_json::from_str(document).unwrap_or(Value::Null);
            Ok(json_response(
                StatusCode::OK,
                &json!({"name": name, "version": version, "schema": document}),
            ))
        }
    }
}

pub(super) fn users_json(shard: &Shard) -> Value {
    let view = shard.state();
    let state = &view.state;
    let users: Vec<Value> = state
        .users
        .iter()
        .map(|(name, user)| {
            let tokens: Vec<Value> = state
                .tokens
                .iter()
                .filter(|(_, t)| t.user == *name)
                .map(|(id, t)| json!({"id": id, "created_at_ms": t.created_at_ms}))
                .collect();
            let grants = if name == ADMIN_USER {
                json!([{"topic": "*", "actions": Action::ALL}])
            } else {
                json!(user.grants)
            };
            json!({
                "name": name,
                "grants": grants,
                "tokens": tokens,
                "created_at_ms": user.created_at_ms,
            })
        })
        .collect();
    json!({ "users": users })
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PasswordBody {
    password: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GrantsBody {
    grants: Vec<GrantBody>,
}

/// One grant as a request writes it: no other field.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GrantBody {
    topic: String,
    actions: Vec<Action>,
}

pub(super) fn parse_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
    shape: &str,
) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        // serde's own wording for a field the type does not have.
        let code = if e.to_string().starts_with("unknown field") {
            ErrorCode::UnknownField
        } else {
            ErrorCode::InvalidRequest
        };
        ApiError::new(code, format!("the body must be {shape}: {e}"))
    })
}

pub(super) async fn put_or_delete_user(
    shard: &Shard,
    method: &Method,
    name: &str,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    if *method == Method::DELETE {
        if !shard.state().state.users.contains_key(name) {
            return Err(no_such("user", name));
        }
        shard.delete_user(name).await?;
        return Ok(empty_response(StatusCode::NO_CONTENT));
    }
    let PasswordBody { password } = parse_body(body, r#"{"password": "..."}"#)?;
    validate_password(&password)?;
    let created = shard.put_user(name, password).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(status, &json!({ "name": name })))
}

pub(super) async fn grants(
    shard: &Shard,
    method: &Method,
    name: &str,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    if *method == Method::PUT {
        let GrantsBody { grants } = parse_body(
            body,
            r#"{"grants": [{"topic": "...", "actions": ["produce" | "consume" | "admin" | "cluster"]}]}"#,
        )?;
        let grants: Vec<Grant> = grants
            .into_iter()
            .map(|g| Grant {
                topic: g.topic,
                actions: g.actions,
            })
            .collect();
        validate_grants(&grants)?;
        if !shard.state().state.users.contains_key(name) {
            return Err(no_such("user", name));
        }
        shard.set_grants(name, grants.clone()).await?;
        return Ok(json_response(StatusCode::OK, &json!({ "grants": grants })));
    }
    let view = shard.state();
    let user = view
        .state
        .users
        .get(name)
        .ok_or_else(|| no_such("user", name))?;
    let grants = if name == ADMIN_USER {
        json!([{"topic": "*", "actions": Action::ALL}])
    } else {
        json!(user.grants)
    };
    Ok(json_response(StatusCode::OK, &json!({ "grants": grants })))
}

pub(super) fn topic_json(topic: &Topic) -> Value {
    let mut value = json!({
        "name": topic.name,
        "partitions": topic.config.partitions,
        "visibility_timeout_ms": topic.config.visibility_timeout_ms,
        "retention_ms": topic.config.retention_ms,
        "max_deliveries": topic.config.max_deliveries,
        "dead_letter_topic": topic.config.dead_letter_topic,
        "schema": topic.config.schema,
        "max_message_bytes": topic.config.max_message_bytes,
        "idempotency_window_ms": topic.config.idempotency_window_ms,
    });
    if let Some(parent) = &topic.parent {
        value["parent"] = json!(parent);
    }
    value
}

pub(super) async fn topic_json_with_stats(shard: &Shard, topic: &Topic) -> Result<Value, ApiError> {
    let (stats, copies) = shard.partition_stats(topic).await?;
    let mut value = topic_json(topic);
    let partition_stats: Vec<Value> = stats
        .iter()
        .enumerate()
        .map(|(partition, s)| {
            json!({
                "partition": partition,
                "owner": topic.owners.get(partition).copied().unwrap_or(0),
                "high_watermark": s.high_watermark,
                "frontier": s.frontier,
                "available": s.available,
                "in_flight": s.in_flight,
                "oldest_unacked_age_ms": s.oldest_unacked_age_ms,
            })
        })
        .collect();
    value["partition_stats"] = json!(partition_stats);
    value["children"] = json!(children_json(&child_statuses(topic, &copies)));
    Ok(value)
}

/// A redrive as `GET /v1/topics/{dlq}/redrive` lists it.
pub(super) fn redrive_json(listed: &RedriveStatus) -> Value {
    let redrive = &listed.redrive;
    let mut value = json!({
        "id": listed.id,
        "to": redrive.to,
        "moved": redrive.moved,
        "remaining": listed.remaining,
        "state": redrive.state.name(),
        "rate_per_s": redrive.rate_per_s,
        "max_messages": redrive.max_messages,
        "node": redrive.node,
        "created_at_ms": redrive.created_at_ms,
    });
    if let RedriveState::Failed(why) = &redrive.state {
        value["error"] = json!(why);
    }
    value
}

/// Children as `GET /v1/topics/{parent}/children` lists them.
pub(super) fn children_json(children: &[ChildStatus]) -> Vec<Value> {
    children
        .iter()
        .map(|c| {
            let mut value = json!({
                "name": c.name,
                "kind": c.kind.name(),
                "lag_messages": c.lag_messages,
                "lag_seconds": c.lag_seconds,
                "dropped_messages": c.dropped_messages,
                "state": c.state,
                "last_error": c.last_error,
            });
            match &c.kind {
                ChildKind::Delay { delay_ms } => value["delay_ms"] = json!(delay_ms),
                ChildKind::Remote { remote } => value["remote"] = remote_json(remote),
                ChildKind::Fanout | ChildKind::Replica => {}
            }
            value
        })
        .collect()
}

pub(super) async fn get_topic(shard: &Shard, name: &str) -> Result<HttpResponse, ApiError> {
    let topic = shard.topic(name)?;
    Ok(json_response(
        StatusCode::OK,
        &topic_json_with_stats(shard, &topic).await?,
    ))
}

/// The retention floor and the largest `max_message_bytes` a topic takes.
pub(crate) fn topic_bounds(shard: &Shard) -> (u64, u64) {
    let settings = shard.settings();
    (
        settings.topics.retention_floor_ms,
        settings.http.max_batch_bytes.max(MAX_MESSAGE_BYTES_DEFAULT),
    )
}

/// A remote child's target as answers show it: never its token.
pub(super) fn remote_json(remote: &RemoteTarget) -> Value {
    json!({
        "url": remote.url,
        "topic": remote.topic,
        "rate_bytes_per_s": remote.rate_bytes_per_s,
    })
}

/// `PUT /v1/topics/{parent}/children/{child}`; a dead-letter topic of the
/// child needs `produce` on it, as for any topic.
pub(super) async fn put_child(
    shard: &Shard,
    parent: &str,
    child: &str,
    body: &[u8],
    user: Option<&str>,
) -> Result<HttpResponse, ApiError> {
    let (floor, max_message) = topic_bounds(shard);
    let request = ChildRequest::parse(body, floor, max_message)?;
    if let (Some(user), Some(Some(dlq))) = (user, &request.topic.dead_letter_topic) {
        shard.authorize(user, Action::Produce, Some(dlq))?;
    }
    let status = |created| {
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        }
    };
    if let ChildKindName::Remote(remote) = request.kind {
        let (created, link) = shard.put_remote_child(parent, child, remote).await?;
        let ChildKind::Remote { remote } = &link.kind else {
            return Err(ApiError::new(
                ErrorCode::Internal,
                "the metastore kept a remote child as another kind",
            ));
        };
        let answer = json!({
            "name": child,
            "parent": parent,
            "kind": "remote",
            "remote": remote_json(remote),
        });
        return Ok(json_response(status(created), &answer));
    }
    let (created, topic) = shard.put_child(parent, child, request).await?;
    Ok(json_response(status(created), &topic_json(&topic)))
}

/// `PUT /v1/topics/{topic}`; with auth on, naming a dead-letter topic
/// also needs `produce` on it (dead letters are written there), so nobody
/// learns of, or writes to, a topic through another's settings.
pub(super) async fn put_topic(
    shard: &Shard,
    name: &str,
    body: &[u8],
    user: Option<&str>,
) -> Result<HttpResponse, ApiError> {
    let (floor, max_message) = topic_bounds(shard);
    let patch = TopicPatch::parse(body, floor, max_message)?;
    if let (Some(user), Some(Some(dlq))) = (user, &patch.dead_letter_topic) {
        shard.authorize(user, Action::Produce, Some(dlq))?;
    }
    let (created, topic) = shard.put_topic(name, patch).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(
        status,
        &topic_json_with_stats(shard, &topic).await?,
    ))
}

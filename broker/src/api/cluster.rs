//! The cluster routes' bodies and answers: admitting a node, node ids in
//! paths, node states, and moves as JSON.

use super::*;
use crate::shard::MemberReadiness;
use narad_net::{ApiError, ErrorCode};
use narad_raft::state::{Move, NodeId};
use serde_json::{json, Value};

/// `POST /v1/cluster/nodes` with `{"id": N, "addr": "HOST:PORT"}`.
pub(super) fn parse_admit(body: &[u8]) -> Result<(NodeId, String), ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Admit {
        id: NodeId,
        addr: String,
    }
    let admit: Admit = super::parse_body(body, r#"{"id": N, "addr": "HOST:PORT"}"#)?;
    if admit.id == 0 || admit.id > u64::from(u16::MAX) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("id {} is not a node id (1 to 65535)", admit.id),
        ));
    }
    crate::config::check_host_port(&admit.addr).map_err(|why| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!("addr {:?} is not HOST:PORT: {why}", admit.addr),
        )
    })?;
    Ok((admit.id, admit.addr))
}

/// `POST /v1/cluster/moves` with `{"topic": T, "partition": P, "to": N}`.
pub(super) fn parse_move(body: &[u8]) -> Result<(String, u32, NodeId), ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct MoveRequest {
        topic: String,
        partition: u32,
        to: NodeId,
    }
    let request: MoveRequest = super::parse_body(body, r#"{"topic": T, "partition": P, "to": N}"#)?;
    narad_net::names::validate_topic_name(&request.topic)?;
    Ok((request.topic, request.partition, request.to))
}

/// The node id a path names.
pub(super) fn node_id(segment: &str) -> Result<NodeId, ApiError> {
    segment
        .parse::<NodeId>()
        .ok()
        .filter(|id| (1..=u64::from(u16::MAX)).contains(id))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("{segment:?} is not a node id (1 to 65535)"),
            )
        })
}

/// A node's state as `GET /v1/cluster` shows it.
pub(super) fn node_state(
    alive: bool,
    decommissioning: bool,
    learner: bool,
    partitions: usize,
) -> &'static str {
    match (alive, decommissioning, learner) {
        (false, _, _) => "dead",
        (true, true, _) if partitions == 0 => "decommissioned",
        (true, true, _) => "decommissioning",
        (true, false, true) => "joining",
        (true, false, false) => "alive",
    }
}

/// `{"moves": [...]}`.
/// `?dry_run=true` on rebalance and decommission: answer the moves that
/// would be planned, and plan nothing.
pub(super) fn dry_run(query: Option<&str>) -> Result<bool, ApiError> {
    let mut query = narad_net::query::Query::parse(query)?;
    let dry_run = query.flag("dry_run")?.unwrap_or(false);
    query.finish()?;
    Ok(dry_run)
}

/// A dry run's answer: what would move, from where to where.
pub(super) fn plans_json(plans: &[narad_raft::state::MovePlan]) -> Value {
    let moves: Vec<Value> = plans
        .iter()
        .map(|p| json!({"topic": p.topic, "partition": p.partition, "from": p.from, "to": p.to}))
        .collect();
    json!({ "dry_run": true, "moves": moves })
}

pub(super) fn moves_json(moves: &[Move]) -> Value {
    let moves: Vec<Value> = moves.iter().map(move_json).collect();
    json!({ "moves": moves })
}

fn move_json(m: &Move) -> Value {
    let remaining = m.total_bytes.saturating_sub(m.copied_bytes);
    let expected_end_ms = (m.state.is_running() && m.rate_bytes_per_s > 0).then(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        now + remaining.saturating_mul(1000) / m.rate_bytes_per_s
    });
    let mut value = json!({
        "id": m.id,
        "topic": m.topic,
        "partition": m.partition,
        "from": m.from,
        "to": m.to,
        "state": m.state.name(),
        "planned_at_ms": m.planned_at_ms,
        "started_at_ms": m.started_at_ms,
        "finished_at_ms": m.finished_at_ms,
        "copied_bytes": m.copied_bytes,
        "total_bytes": m.total_bytes,
        "rate_bytes_per_s": m.rate_bytes_per_s,
        "expected_end_ms": expected_end_ms,
    });
    if let Some(reason) = &m.reason {
        value["reason"] = json!(reason);
    }
    if let Some(offset) = m.promoted_at_offset {
        value["promoted_at_offset"] = json!(offset);
    }
    value
}

/// `GET /v1/cluster`: the members, their state as the controller last
/// judged it (through Raft), how many partitions each owns, and whether
/// each is ready (asked now: [`Shard::readiness_of`]).
pub(super) async fn cluster_json(shard: &Shard) -> Value {
    let meta = shard.meta();
    let members = meta.members();
    let ids: Vec<NodeId> = members.iter().map(|(id, _)| *id).collect();
    let readiness = shard.readiness_of(&ids).await;
    let view = meta.view();
    let state = &view.state;
    let learners = meta.learners();
    let nodes: Vec<Value> = members
        .into_iter()
        .zip(readiness)
        .map(|((id, addr), readiness)| {
            let record = state.nodes.get(&id);
            let alive = record.is_none_or(|record| record.alive);
            let partitions = state
                .topics
                .values()
                .flat_map(|t| t.owners.iter())
                .filter(|owner| **owner == id)
                .count();
            let mut node = json!({
                "id": id,
                "addr": addr,
                "kafka_addr": state.kafka_addrs.get(&id),
                "state": cluster::node_state(alive, record.is_some_and(|r| r.decommissioning), learners.contains(&id), partitions),
                "partitions": partitions,
            });
            put_readiness(&mut node, readiness);
            node
        })
        .collect();
    json!({
        "cluster_id": state.cluster_id,
        "leader": meta.leader(),
        "term": meta.term(),
        "nodes": nodes,
    })
}

/// `"ready"`, and when the node is not, `"not_ready"`: the code and message
/// its `/readyz` gives, or code `unreachable` when it could not be asked.
fn put_readiness(node: &mut Value, readiness: MemberReadiness) {
    let not_ready = match readiness {
        MemberReadiness::Ready => None,
        MemberReadiness::NotReady(error) => {
            Some(json!({"code": error.code.as_str(), "message": error.message}))
        }
        MemberReadiness::Unreachable(reason) => {
            Some(json!({"code": NOT_READY_UNREACHABLE, "message": reason}))
        }
    };
    node["ready"] = json!(not_ready.is_none());
    if let Some(not_ready) = not_ready {
        node["not_ready"] = not_ready;
    }
}

/// The `not_ready` code of a member that could not be asked.
const NOT_READY_UNREACHABLE: &str = "unreachable";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admitting_needs_a_node_id_and_a_host_and_port() {
        assert_eq!(
            parse_admit(br#"{"id": 4, "addr": "narad-3.narad:9080"}"#).expect("ok"),
            (4, "narad-3.narad:9080".to_string())
        );
        for bad in [
            &br#"{"id": 0, "addr": "h:1"}"#[..],
            br#"{"id": 4}"#,
            br#"{"id": 4, "addr": "no-port"}"#,
            b"nope",
        ] {
            assert_eq!(
                parse_admit(bad).expect_err("refused").code,
                ErrorCode::InvalidRequest
            );
        }
        assert_eq!(
            parse_admit(br#"{"id": 4, "addr": "h:1", "x": 1}"#)
                .expect_err("refused")
                .code,
            ErrorCode::UnknownField
        );
        assert_eq!(node_id("3").expect("ok"), 3);
        assert!(node_id("x").is_err() && node_id("0").is_err());
    }

    #[test]
    fn node_states_follow_liveness_decommission_and_membership() {
        assert_eq!(node_state(true, false, false, 3), "alive");
        assert_eq!(node_state(true, false, true, 0), "joining");
        assert_eq!(node_state(true, true, false, 2), "decommissioning");
        assert_eq!(node_state(true, true, false, 0), "decommissioned");
        assert_eq!(node_state(false, true, false, 0), "dead");
    }
}

//! `/metrics`: the node's Prometheus exposition, with the gauges read
//! from every shard at scrape time.

use super::*;

/// Prometheus text exposition of the node's figures, every shard's.
pub(super) async fn metrics(shard: &Shard) -> HttpResponse {
    let shards = shard.gauges().await;
    // Every topic with a dead-letter topic has its counter from the start,
    // at 0, so an alert on its increase sees the first dead letter.
    for topic in shard.topics() {
        if topic.config.dead_letter_topic.is_some() {
            metrics::counter!(DEAD_LETTERED_TOTAL, "topic" => topic.name).increment(0);
        }
    }
    // Let go early by the node's table or by a shard's WAL (which then
    // does not hold it across a restart).
    let (keys_held, table_forgotten) = shard.idempotency_keys();
    let wal_forgotten: u64 = shards
        .iter()
        .map(|g| g.wal_keys_forgotten + g.owner_keys_forgotten)
        .sum();
    metrics::counter!(IDEMPOTENCY_KEYS_FORGOTTEN_TOTAL).absolute(table_forgotten + wal_forgotten);
    let mut out = shard.render_metrics();
    let mut gauge = |name: &str, samples: Vec<(String, f64)>| {
        let help = crate::metric_names::help(name);
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (labels, value) in samples {
            // Prometheus spells infinity `+Inf`, Rust `inf`.
            let value = if value == f64::INFINITY {
                "+Inf".to_string()
            } else {
                value.to_string()
            };
            out.push_str(&format!("{name}{labels} {value}\n"));
        }
    };
    let failed = shards.iter().any(|g| g.wal_failure.is_some());
    gauge(
        INGRESS_WAL_FAILED,
        vec![(String::new(), if failed { 1.0 } else { 0.0 })],
    );
    let acks_failed = shards.iter().any(|g| g.ack_state_failure.is_some());
    gauge(
        CONSUMER_STATE_FAILED,
        vec![(String::new(), if acks_failed { 1.0 } else { 0.0 })],
    );
    let per_shard = |f: &dyn Fn(&ShardGauges) -> f64| -> Vec<(String, f64)> {
        shards
            .iter()
            .map(|g| (format!("{{shard=\"{}\"}}", g.shard), f(g)))
            .collect()
    };
    gauge(WAL_USED_BYTES, per_shard(&|g| g.wal_used_bytes as f64));
    gauge(IDEMPOTENCY_KEYS, vec![(String::new(), keys_held as f64)]);
    gauge(
        DISPATCHER_PENDING_RECORDS,
        per_shard(&|g| g.dispatcher_pending as f64),
    );
    gauge(
        RAFT_IS_LEADER,
        vec![(
            String::new(),
            if shard.meta().is_leader() { 1.0 } else { 0.0 },
        )],
    );
    gauge(
        CONNECTIONS_OPEN,
        vec![(String::new(), shard.http_budget().connections_open() as f64)],
    );
    gauge(
        HTTP_BUFFERED_BODY_BYTES,
        vec![(
            String::new(),
            shard.http_budget().buffered_body_bytes() as f64,
        )],
    );
    gauge(
        NODE_ALIVE,
        shard
            .members_alive()
            .into_iter()
            .map(|(node, alive)| {
                (
                    format!("{{node=\"{node}\"}}"),
                    if alive { 1.0 } else { 0.0 },
                )
            })
            .collect(),
    );
    gauge(RAFT_TERM, vec![(String::new(), shard.meta().term() as f64)]);
    let partitions: Vec<&(String, u32, crate::owner::PartitionStats)> =
        shards.iter().flat_map(|g| &g.partitions).collect();
    let label =
        |topic: &str, partition: u32| format!("{{topic=\"{topic}\",partition=\"{partition}\"}}");
    let series = |f: &dyn Fn(&crate::owner::PartitionStats) -> f64| -> Vec<(String, f64)> {
        partitions
            .iter()
            .map(|(t, p, s)| (label(t, *p), f(s)))
            .collect()
    };
    gauge(
        PARTITION_HIGH_WATERMARK,
        series(&|s| s.high_watermark as f64),
    );
    gauge(PARTITION_FRONTIER, series(&|s| s.frontier as f64));
    gauge(
        PARTITION_AVAILABLE_MESSAGES,
        series(&|s| s.available as f64),
    );
    gauge(PARTITION_IN_FLIGHT, series(&|s| s.in_flight as f64));
    gauge(
        PARTITION_OLDEST_UNACKED_AGE_SECONDS,
        series(&|s| s.oldest_unacked_age_ms as f64 / 1000.0),
    );
    // Each child's copies of this node's parent partitions, summed.
    let mut copies: std::collections::BTreeMap<(&str, &str), (u64, u64, u64)> =
        std::collections::BTreeMap::new();
    for copy in shards.iter().flat_map(|g| &g.copies) {
        let entry = copies
            .entry((copy.parent.as_str(), copy.child.as_str()))
            .or_default();
        entry.0 += copy.lag_messages;
        entry.1 = entry.1.max(copy.lag_ms);
        entry.2 += copy.dropped;
    }
    let per_child = |f: &dyn Fn(&(u64, u64, u64)) -> f64| -> Vec<(String, f64)> {
        copies
            .iter()
            .map(|((parent, child), v)| {
                (format!("{{parent=\"{parent}\",child=\"{child}\"}}"), f(v))
            })
            .collect()
    };
    let lag_messages = per_child(&|v| v.0 as f64);
    let lag_seconds = per_child(&|v| v.1 as f64 / 1000.0);
    let dropped = per_child(&|v| v.2 as f64);
    gauge(FANOUT_CHILD_LAG_MESSAGES, lag_messages);
    gauge(FANOUT_CHILD_LAG_SECONDS, lag_seconds);
    // The least headroom over this node's partitions of each remote child.
    let mut headroom: std::collections::BTreeMap<(&str, &str), u64> =
        std::collections::BTreeMap::new();
    for (parent, child, ms) in shards.iter().flat_map(|g| &g.remote_headroom) {
        let least = headroom
            .entry((parent.as_str(), child.as_str()))
            .or_insert(u64::MAX);
        *least = (*least).min(*ms);
    }
    gauge(
        REMOTE_CHILD_HEADROOM_SECONDS,
        headroom
            .iter()
            .map(|((parent, child), ms)| {
                let seconds = if *ms == u64::MAX {
                    f64::INFINITY
                } else {
                    *ms as f64 / 1000.0
                };
                (
                    format!("{{parent=\"{parent}\",child=\"{child}\"}}"),
                    seconds,
                )
            })
            .collect(),
    );
    out.push_str(&format!(
        "# HELP {FANOUT_CHILD_DROPPED_MESSAGES} {}\n# TYPE {FANOUT_CHILD_DROPPED_MESSAGES} counter\n",
        crate::metric_names::help(FANOUT_CHILD_DROPPED_MESSAGES)
    ));
    for (labels, value) in dropped {
        out.push_str(&format!(
            "{FANOUT_CHILD_DROPPED_MESSAGES}{labels} {value}\n"
        ));
    }
    let mut response = hyper::Response::new(Full::new(Bytes::from(out)));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

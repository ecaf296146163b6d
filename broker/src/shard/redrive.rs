//! Dead-letter redrive: moving the messages of a dead-letter topic back to
//! a topic that processes them, at a set rate. A redrive is a record in the
//! metastore (so every node lists it and a cancel reaches it wherever it
//! runs), run by shard 0 of the node that took the request: it leases a
//! batch from the dead-letter topic, writes it durably to the target (same
//! ids, keys and values, through this shard's WAL as a produce), and only
//! then acks it. A crash between the two leaves a message in both topics,
//! never in neither; the lease ends and the node, started again, carries
//! on from the metastore's record.

use narad_net::types::RedriveRequest;
use narad_raft::state::{Redrive, RedriveState};

use super::*;
use crate::limits::{
    REDRIVE_BATCH_MAX, REDRIVE_EMPTY_GRACE, REDRIVE_PROGRESS_INTERVAL, REDRIVE_RETRY,
    REDRIVE_VISIBILITY_MS, REDRIVE_WAIT_MS,
};

/// A redrive as `GET /v1/topics/{dlq}/redrive` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveStatus {
    pub id: String,
    pub redrive: Redrive,
    /// Messages still to move: what the dead-letter topic holds (up to the
    /// task's `max_messages`), 0 once it ended.
    pub remaining: u64,
}

/// Tokens of a rate limit: `rate` a second, at most a second's worth saved.
pub(super) struct Bucket {
    rate: u64,
    tokens: f64,
    at_ms: u64,
}

impl Bucket {
    pub(super) fn new(rate: u64, now_ms: u64) -> Self {
        Self {
            rate,
            tokens: rate as f64,
            at_ms: now_ms,
        }
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.at_ms) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * self.rate as f64).min(self.rate.max(1) as f64);
        self.at_ms = now_ms;
    }

    /// Whole tokens now.
    pub(super) fn available(&mut self, now_ms: u64) -> u64 {
        self.refill(now_ms);
        self.tokens.max(0.0) as u64
    }

    pub(super) fn take(&mut self, n: u64) {
        self.tokens -= n as f64;
    }

    /// Tokens a second.
    pub(super) fn rate(&self) -> u64 {
        self.rate
    }

    /// Milliseconds until one token is there.
    pub(super) fn wait_ms(&self) -> u64 {
        self.wait_for_ms(1)
    }

    /// Milliseconds until `tokens` are there (at most a second's worth can
    /// be saved: ask for no more than [`Self::rate`]).
    pub(super) fn wait_for_ms(&self, tokens: u64) -> u64 {
        let missing = (tokens as f64 - self.tokens).max(0.0);
        ((missing * 1000.0) / self.rate.max(1) as f64).ceil() as u64
    }
}

impl<F: FileSystem> Shard<F> {
    /// Starts a redrive of `dlq` to `request.to`, run by this node.
    pub async fn start_redrive(
        &self,
        dlq: &str,
        request: RedriveRequest,
    ) -> Result<(String, Redrive), ApiError> {
        self.topic(dlq)?;
        let to = self.topic(&request.to).map_err(|e| {
            if e.code == ErrorCode::TopicNotFound {
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("to: topic {:?} does not exist", request.to),
                )
            } else {
                e
            }
        })?;
        // A fresh message id: unique in the cluster for its life.
        let seq = self.flow.next_seq.get();
        self.flow.next_seq.set(seq + 1);
        let id = format!("{:032x}", message_id(self.identity, seq));
        let command = Command::StartRedrive {
            id: id.clone(),
            dlq: dlq.to_string(),
            to: to.name.clone(),
            rate_per_s: request.rate_per_s,
            max_messages: request.max_messages,
            node: self.me(),
            now_ms: self.wall(),
        };
        let redrive = match self.propose(command).await? {
            Applied::RedriveChanged(redrive) => redrive,
            _ => {
                return Err(ApiError::new(
                    ErrorCode::Internal,
                    "the metastore answered a redrive oddly",
                ))
            }
        };
        let wanted = id.clone();
        self.applied_here_when(|state| state.redrives.contains_key(&wanted))
            .await;
        Ok((id, redrive))
    }

    /// Cancels a running redrive (a finished one stays as it ended).
    pub async fn cancel_redrive(&self, dlq: &str, id: &str) -> Result<(), ApiError> {
        self.topic(dlq)?;
        self.propose(Command::CancelRedrive {
            dlq: dlq.to_string(),
            id: id.to_string(),
        })
        .await?;
        let id = id.to_string();
        self.applied_here_when(|state| {
            state
                .redrives
                .get(&id)
                .is_none_or(|r| r.state != RedriveState::Running)
        })
        .await;
        Ok(())
    }

    /// The redrives of `dlq`, with what each has left to move.
    pub async fn redrives(&self, dlq: &Topic) -> Result<Vec<RedriveStatus>, ApiError> {
        let view = self.view();
        let tasks: Vec<(String, Redrive)> = view
            .state
            .redrives
            .iter()
            .filter(|(_, r)| r.dlq == dlq.name)
            .map(|(id, r)| (id.clone(), r.clone()))
            .collect();
        let held = if tasks.iter().any(|(_, r)| r.state == RedriveState::Running) {
            let (stats, _) = self.partition_stats(dlq).await?;
            stats.iter().map(|s| s.available + s.in_flight).sum()
        } else {
            0
        };
        let mut listed: Vec<RedriveStatus> = tasks
            .into_iter()
            .map(|(id, redrive)| {
                let remaining = match (&redrive.state, redrive.max_messages) {
                    (RedriveState::Running, Some(max)) => {
                        held.min(max.saturating_sub(redrive.moved))
                    }
                    (RedriveState::Running, None) => held,
                    _ => 0,
                };
                RedriveStatus {
                    id,
                    redrive,
                    remaining,
                }
            })
            .collect();
        listed.sort_by_key(|s| (s.redrive.created_at_ms, s.id.clone()));
        Ok(listed)
    }

    /// On shard 0: runs this node's running redrives, each once, as the
    /// metastore lists them (also those it ran before a restart).
    pub async fn run_redrives(self: Rc<Self>) {
        let running: Rc<RefCell<HashSet<String>>> = Rc::default();
        let mut changes = self.env.meta.subscribe();
        loop {
            let mine: Vec<String> = self
                .view()
                .state
                .redrives
                .iter()
                .filter(|(_, r)| r.node == self.me() && r.state == RedriveState::Running)
                .map(|(id, _)| id.clone())
                .collect();
            for id in mine {
                if !running.borrow_mut().insert(id.clone()) {
                    continue;
                }
                let (shard, running) = (self.clone(), running.clone());
                self.env.runtime.spawn(Box::pin(async move {
                    shard.run_redrive(&id).await;
                    running.borrow_mut().remove(&id);
                }));
            }
            if changes.changed().await.is_err() || self.is_stopping() {
                return;
            }
        }
    }

    /// The redrive while it runs, as the metastore has it now.
    fn running_redrive(&self, id: &str) -> Option<Redrive> {
        self.view()
            .state
            .redrives
            .get(id)
            .filter(|r| r.state == RedriveState::Running)
            .cloned()
    }

    async fn run_redrive(&self, id: &str) {
        let Some(start) = self.running_redrive(id) else {
            return;
        };
        tracing::info!(id, dlq = %start.dlq, to = %start.to, rate_per_s = ?start.rate_per_s, "redrive running");
        let mut moved = start.moved;
        let mut reported = moved;
        let mut reported_at = self.mono();
        let mut bucket = start.rate_per_s.map(|rate| Bucket::new(rate, self.mono()));
        // When the topic was first found empty: it must stay so for
        // REDRIVE_EMPTY_GRACE, since messages accepted just before may not
        // have reached their partitions yet.
        let mut empty_since: Option<u64> = None;
        let end = loop {
            if self.is_stopping() {
                // Carried on by this node's next start.
                break None;
            }
            let Some(redrive) = self.running_redrive(id) else {
                break None;
            };
            if self.mono().saturating_sub(reported_at)
                >= REDRIVE_PROGRESS_INTERVAL.as_millis() as u64
                && moved != reported
            {
                self.report_redrive(id, moved, None).await;
                (reported, reported_at) = (moved, self.mono());
            }
            let left = redrive.max_messages.map(|max| max.saturating_sub(moved));
            if left == Some(0) {
                break Some(RedriveState::Done);
            }
            let mut want = left.unwrap_or(u64::MAX).min(REDRIVE_BATCH_MAX as u64);
            if let Some(bucket) = &mut bucket {
                let tokens = bucket.available(self.mono());
                if tokens == 0 {
                    let wait = Duration::from_millis(bucket.wait_ms().max(1));
                    self.env.runtime.sleep(wait).await;
                    continue;
                }
                want = want.min(tokens);
            }
            match self.redrive_batch(&redrive, want).await {
                Ok(Some(n)) => {
                    empty_since = None;
                    moved += n;
                    if let Some(bucket) = &mut bucket {
                        bucket.take(n);
                    }
                }
                Ok(None) => {
                    let now = self.mono();
                    let since = *empty_since.get_or_insert(now);
                    if now.saturating_sub(since) >= REDRIVE_EMPTY_GRACE.as_millis() as u64 {
                        break Some(RedriveState::Done);
                    }
                    self.env
                        .runtime
                        .sleep(Duration::from_millis(REDRIVE_WAIT_MS))
                        .await;
                }
                Err(error) if error.code == ErrorCode::TopicNotFound => {
                    break Some(RedriveState::Failed(error.message));
                }
                Err(error) => {
                    tracing::warn!(id, %error, "a redrive batch failed; trying again");
                    self.env.runtime.sleep(REDRIVE_RETRY).await;
                }
            }
        };
        match end {
            Some(state) => {
                tracing::info!(id, moved, state = state.name(), "redrive ended");
                self.report_redrive(id, moved, Some(state)).await;
            }
            None if moved != reported => self.report_redrive(id, moved, None).await,
            None => {}
        }
    }

    /// Moves up to `max` messages: `Ok(None)` once the dead-letter topic
    /// has none left to lease.
    async fn redrive_batch(&self, redrive: &Redrive, max: u64) -> Result<Option<u64>, ApiError> {
        let dlq = self.topic(&redrive.dlq)?;
        let to = self.topic(&redrive.to)?;
        let request = ConsumeRequest {
            max_messages: u32::try_from(max).unwrap_or(u32::MAX).max(1),
            wait_ms: 0,
            visibility_timeout_ms: Some(REDRIVE_VISIBILITY_MS),
            partition: None,
        };
        let deliveries = self
            .collect_for_client(&dlq, request, REDRIVE_VISIBILITY_MS, None)
            .await?;
        if deliveries.is_empty() {
            // Leased by a consumer (or by an earlier try of this redrive),
            // or on a node that does not answer: wait before calling it done.
            if self.holds_nothing(&dlq).await? {
                return Ok(None);
            }
            self.env
                .runtime
                .sleep(Duration::from_millis(REDRIVE_WAIT_MS))
                .await;
            return Ok(Some(0));
        }
        let messages: Vec<Message> = deliveries
            .iter()
            .map(|d| Message {
                idempotency_key: None,
                id: d.id,
                produced_at_ms: d.produced_at_ms,
                key: d.key.clone(),
                value: d.value.clone(),
            })
            .collect();
        // Durable in the target first; only then acked where it was.
        self.write_durably(&to, &messages).await?;
        let receipts: Vec<String> = deliveries.into_iter().map(|d| d.receipt).collect();
        let mut count = 0;
        for outcome in self.settle(&dlq, &receipts, SettleAction::Ack).await {
            match outcome {
                Ok(_) => count += 1,
                // Its lease ended first: it is moved again (at least once),
                // and counted then.
                Err(error) => tracing::debug!(%error, "a redriven message's ack failed"),
            }
        }
        Ok(Some(count))
    }

    async fn report_redrive(&self, id: &str, moved: u64, state: Option<RedriveState>) {
        let command = Command::RedriveProgress {
            id: id.to_string(),
            moved,
            state,
        };
        if let Err(error) = self.propose(command).await {
            tracing::warn!(id, %error, "a redrive's progress was not recorded");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_rate_a_second_and_saves_at_most_a_second() {
        let mut bucket = Bucket::new(10, 0);
        assert_eq!(bucket.available(0), 10);
        bucket.take(10);
        assert_eq!(bucket.available(0), 0);
        assert_eq!(bucket.wait_ms(), 100);
        assert_eq!(bucket.available(250), 2);
        assert_eq!(bucket.available(60_000), 10, "a second's worth at most");
    }
}

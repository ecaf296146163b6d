//! Children: creating and deleting them through the metastore, and the
//! copies. Each partition of a parent with children copies, on the shard
//! that owns it, every message to each child from a durable cursor kept in
//! the partition's folder (`children/{child}-{incarnation}.cursor`): read
//! from the cursor on, commit to the child's partitions (their owners
//! fsync and read back, as for any commit), then move the cursor, stored
//! at most every `CHILD_CURSOR_STORE_INTERVAL` (one fdatasync fewer per
//! copy under load). A crash copies what followed the stored cursor again
//! (at least once); nothing is skipped but what the parent's retention
//! removed first, which is counted.

use narad_net::types::{ChildKindName, ChildRequest, RemoteRequest};
use narad_raft::state::{Child, ChildKind, RemoteTarget};
use narad_storage::cursor::Cursor;
use narad_storage::log::StoredMessage;

use super::child_cursor::{due_count, CopyCursor, Next, Observed};
use super::*;
use crate::controller::place_replica;
use crate::limits::{
    CHILD_BEHIND_AFTER_MS, CHILD_COPY_BYTES_MAX, CHILD_COPY_RECORDS_MAX, CHILD_RETRY_BACKOFF_MAX,
    CHILD_RETRY_BACKOFF_MIN, CHILD_START_CLOCK_SLACK_MS, REMOTE_RATE_BATCH_DIVISOR,
    REMOTE_RETRY_BACKOFF_MAX, REMOTE_RETRY_BACKOFF_MIN, REMOTE_SHIP_BYTES_MAX,
    REMOTE_SHIP_RECORDS_MAX,
};
use crate::ship::Shipment;

/// One copy: a parent partition of this shard to one child.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct CopyKey {
    parent: String,
    parent_incarnation: u64,
    partition: u32,
    child: String,
    child_incarnation: u64,
}

/// How a running copy stands, and its stop switch.
#[derive(Default)]
pub(super) struct CopyState {
    lag_messages: Cell<u64>,
    lag_ms: Cell<u64>,
    dropped: Cell<u64>,
    last_error: RefCell<Option<String>>,
    /// A remote copy's headroom: how long until its oldest message not yet
    /// shipped ages out of the parent (`u64::MAX`: never); `None` for the
    /// other kinds.
    headroom_ms: Cell<Option<u64>>,
    /// The link as the copy last saw it: a change (a remote child's new
    /// token) wakes the copy, which tries again at once.
    link: RefCell<Option<ChildKind>>,
    stop: Cell<bool>,
    /// Raised to stop the copy.
    wake: Signal,
    /// Set once the copy ended (its cursor stored, if it could be).
    ended: Cell<bool>,
}

/// The copies this shard runs (in key order: they start, and report, in it).
pub(super) type Copies = RefCell<BTreeMap<CopyKey, Rc<CopyState>>>;

/// Where a copy goes: a topic of this cluster, or one of another.
enum Target {
    Local(Rc<Topic>),
    Remote(RemoteTarget),
}

/// A child as `GET /v1/topics/{parent}/children` shows it: its figures
/// summed over the parent's partitions.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildStatus {
    pub name: String,
    pub kind: ChildKind,
    pub lag_messages: u64,
    pub lag_seconds: f64,
    pub dropped_messages: u64,
    pub state: &'static str,
    pub last_error: Option<String>,
}

/// The child partition a parent partition's message goes to: the same
/// partition when the counts match (a replica always), else by key, else
/// spread by parent partition.
fn child_partition(
    parent_partitions: u32,
    child: &Topic,
    partition: u32,
    key: Option<&[u8]>,
) -> u32 {
    let count = child.config.partitions.max(1);
    if count == parent_partitions {
        return partition;
    }
    match key {
        Some(key) => partition_for_key(key, count),
        None => partition % count,
    }
}

impl<F: FileSystem> Shard<F> {
    /// Creates or changes a child through the metastore. Returns whether it
    /// was created, and the child topic.
    pub async fn put_child(
        &self,
        parent: &str,
        child: &str,
        request: ChildRequest,
    ) -> Result<(bool, Topic), ApiError> {
        let parent_topic = self.topic(parent)?;
        let kind = match request.kind {
            ChildKindName::Fanout => ChildKind::Fanout,
            ChildKindName::Delay { delay_ms } => ChildKind::Delay { delay_ms },
            ChildKindName::Replica => ChildKind::Replica,
            ChildKindName::Remote(remote) => {
                return Err(ApiError::new(
                    ErrorCode::Internal,
                    format!(
                        "a remote child ({}) goes through put_remote_child",
                        remote.url
                    ),
                ))
            }
        };
        let existing = self.view().state.topics.get(child).cloned();
        let mut patch = request.topic;
        if existing.is_none() && patch.partitions.is_none() {
            // A new child has its parent's partition count unless told.
            patch.partitions = Some(parent_topic.config.partitions);
        }
        let (config, added) = self.resolve_config(existing.as_ref(), patch)?;
        let new_owners = match (&kind, &existing) {
            (ChildKind::Replica, None) => {
                if config.partitions != parent_topic.config.partitions {
                    return Err(ApiError::new(
                        ErrorCode::InvalidRequest,
                        format!(
                            "a replica child has its parent's partition count ({}), not {}",
                            parent_topic.config.partitions, config.partitions
                        ),
                    ));
                }
                place_replica(child, &parent_topic.owners, &self.live_nodes()).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidRequest,
                        "a replica child needs a live node other than the owner of each parent partition; this cluster has none (a single node cannot hold a replica)",
                    )
                })?
            }
            _ => {
                let existing_partitions = existing.as_ref().map_or(0, |t| t.config.partitions);
                place(child, existing_partitions, added, &self.live_nodes())
            }
        };
        let command = Command::PutChild {
            parent: parent.to_string(),
            child: child.to_string(),
            kind: kind.clone(),
            config,
            new_owners,
            now_ms: self.wall(),
        };
        let (created, topic) = match self.propose(command).await? {
            Applied::ChildPut { topic, created } => (created, topic),
            _ => {
                return Err(ApiError::new(
                    ErrorCode::Internal,
                    "the metastore answered a child change oddly",
                ))
            }
        };
        self.applied_link_here(parent, child, &kind).await;
        self.reconcile_owners();
        Ok((created, topic))
    }

    /// Creates a remote child, or changes its target (a new token, URL,
    /// topic or rate: the copy goes on from its cursor with it). Returns
    /// whether it was created, and the link.
    pub async fn put_remote_child(
        &self,
        parent: &str,
        child: &str,
        remote: RemoteRequest,
    ) -> Result<(bool, Child), ApiError> {
        self.topic(parent)?;
        let remote = Box::new(RemoteTarget {
            url: remote.url,
            topic: remote.topic,
            token: remote.token,
            rate_bytes_per_s: remote.rate_bytes_per_s,
        });
        let command = Command::PutRemoteChild {
            parent: parent.to_string(),
            child: child.to_string(),
            remote,
            now_ms: self.wall(),
        };
        let (created, link) = match self.propose(command).await? {
            Applied::RemoteChildPut { link, created } => (created, link),
            _ => {
                return Err(ApiError::new(
                    ErrorCode::Internal,
                    "the metastore answered a child change oddly",
                ))
            }
        };
        self.applied_link_here(parent, child, &link.kind).await;
        Ok((created, link))
    }

    /// Waits until this node applied the link of `child` to `parent` as
    /// `kind` (so the next request here sees the change).
    async fn applied_link_here(&self, parent: &str, child: &str, kind: &ChildKind) {
        self.applied_here_when(|state| {
            state
                .topics
                .get(parent)
                .is_some_and(|p| p.children.get(child).is_some_and(|c| c.kind == *kind))
        })
        .await;
    }

    /// Stops copying to `child` (the child topic stays).
    pub async fn delete_child(&self, parent: &str, child: &str) -> Result<(), ApiError> {
        self.topic(parent)?;
        self.propose(Command::DeleteChild {
            parent: parent.to_string(),
            child: child.to_string(),
        })
        .await?;
        let (parent, child) = (parent.to_string(), child.to_string());
        self.applied_here_when(|state| {
            state
                .topics
                .get(&parent)
                .is_none_or(|p| !p.children.contains_key(&child))
        })
        .await;
        Ok(())
    }

    /// Every child of `parent` with its figures summed over the parent's
    /// partitions (from the shards and nodes that own them).
    pub async fn child_statuses(&self, parent: &Topic) -> Result<Vec<ChildStatus>, ApiError> {
        if parent.children.is_empty() {
            return Ok(Vec::new());
        }
        let (_, copies) = self.partition_stats(parent).await?;
        Ok(child_statuses(parent, &copies))
    }

    /// Starts the copies this shard should run and stops the others: one
    /// per partition of this shard and child of its topic.
    pub(super) fn reconcile_children(self: &Rc<Self>) {
        if self.is_stopping() {
            return;
        }
        let view = self.view();
        let mut wanted = BTreeMap::new();
        for parent in view
            .state
            .topics
            .values()
            .filter(|t| !t.children.is_empty())
        {
            let placement = self.placement(parent);
            for partition in 0..parent.config.partitions {
                // A partition frozen for its handover copies nothing more
                // here: its cursors go with it.
                if placement.locate(partition) != Location::Here
                    || self.is_frozen(parent, partition)
                {
                    continue;
                }
                for (name, link) in &parent.children {
                    let child_exists = !link.kind.is_local()
                        || view
                            .state
                            .topics
                            .get(name)
                            .is_some_and(|c| c.incarnation == link.incarnation);
                    if child_exists {
                        let key = CopyKey {
                            parent: parent.name.clone(),
                            parent_incarnation: parent.incarnation,
                            partition,
                            child: name.clone(),
                            child_incarnation: link.incarnation,
                        };
                        wanted.insert(key, link.kind.clone());
                    }
                }
            }
        }
        let mut copies = self.copies.borrow_mut();
        copies.retain(|key, state| {
            let Some(kind) = wanted.get(key) else {
                tracing::debug!(?key, "stopping a copy");
                state.stop.set(true);
                state.wake.notify();
                return false;
            };
            let mut seen = state.link.borrow_mut();
            if seen.as_ref() != Some(kind) {
                *seen = Some(kind.clone());
                state.wake.notify();
            }
            true
        });
        for (key, kind) in wanted {
            if copies.contains_key(&key) {
                continue;
            }
            let state = Rc::new(CopyState {
                link: RefCell::new(Some(kind)),
                ..CopyState::default()
            });
            copies.insert(key.clone(), state.clone());
            let shard = self.clone();
            self.env
                .runtime
                .spawn(Box::pin(async move { shard.run_copy(key, state).await }));
        }
    }

    /// Wakes every copy to see that the shard stops (each then stores its
    /// cursor and ends).
    pub(super) fn stop_copies(&self) {
        for state in self.copies.borrow().values() {
            state.wake.notify();
        }
    }

    /// Stops the copies of one partition (each stores its cursor as it
    /// ends) and waits, up to `wait`, until they ended.
    pub(super) async fn stop_copies_of(&self, key: &(String, u64, u32), wait: Duration) {
        let mut stopped = Vec::new();
        self.copies.borrow_mut().retain(|copy, state| {
            let stop =
                copy.parent == key.0 && copy.parent_incarnation == key.1 && copy.partition == key.2;
            if stop {
                state.stop.set(true);
                state.wake.notify();
                stopped.push(state.clone());
            }
            !stop
        });
        let deadline = self.mono() + u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        while stopped.iter().any(|s| !s.ended.get()) && self.mono() < deadline {
            self.env.runtime.sleep(Duration::from_millis(2)).await;
        }
    }

    /// Copies that have not ended yet.
    pub(super) fn copies_running(&self) -> usize {
        self.copies.borrow().len()
    }

    /// The figures of this shard's copies (of `only` these partitions of a
    /// topic, or all).
    pub(super) fn copy_figures(&self, only: Option<(&Topic, &[u32])>) -> Vec<CopyFigures> {
        self.copies
            .borrow()
            .iter()
            .filter(|(key, _)| {
                only.is_none_or(|(topic, partitions)| {
                    key.parent == topic.name
                        && key.parent_incarnation == topic.incarnation
                        && partitions.contains(&key.partition)
                })
            })
            .map(|(key, state)| CopyFigures {
                parent: key.parent.clone(),
                child: key.child.clone(),
                partition: key.partition,
                lag_messages: state.lag_messages.get(),
                lag_ms: state.lag_ms.get(),
                dropped: state.dropped.get(),
                last_error: state.last_error.borrow().clone(),
            })
            .collect()
    }

    /// (parent, child, headroom) of this shard's remote copies that have
    /// looked at their partition.
    pub(super) fn remote_headroom(&self) -> Vec<(String, String, u64)> {
        self.copies
            .borrow()
            .iter()
            .filter_map(|(key, state)| {
                let headroom = state.headroom_ms.get()?;
                Some((key.parent.clone(), key.child.clone(), headroom))
            })
            .collect()
    }

    /// Runs one copy until it is stopped, trying again after failures.
    async fn run_copy(self: Rc<Self>, key: CopyKey, state: Rc<CopyState>) {
        let remote = state
            .link
            .borrow()
            .as_ref()
            .is_some_and(|kind| !kind.is_local());
        let (backoff_min, backoff_max) = if remote {
            (REMOTE_RETRY_BACKOFF_MIN, REMOTE_RETRY_BACKOFF_MAX)
        } else {
            (CHILD_RETRY_BACKOFF_MIN, CHILD_RETRY_BACKOFF_MAX)
        };
        let mut backoff = backoff_min;
        let mut attempt: u64 = 0;
        // Kept across attempts: a failed attempt must not make a delay
        // child's waiting copies wait a whole delay again.
        let mut observed = Observed::default();
        while !state.stop.get() && !self.is_stopping() {
            let seen = state.wake.version();
            match self.copy(&key, &state, &mut observed).await {
                Ok(()) => break,
                Err(error) => {
                    tracing::debug!(parent = %key.parent, partition = key.partition, child = %key.child, %error, "a copy attempt failed");
                    let first = state.last_error.borrow().as_deref() != Some(&error.message);
                    if first {
                        tracing::warn!(parent = %key.parent, partition = key.partition, child = %key.child, %error, "copying to a child failed; trying again");
                    }
                    *state.last_error.borrow_mut() = Some(error.message);
                    // Full jitter between the least backoff and this
                    // attempt's ceiling: copies that failed together (a
                    // remote that went away) do not come back together.
                    attempt += 1;
                    let wait = jittered(backoff_min, backoff, self.jitter_seed(&key, attempt));
                    futures_lite::future::or(
                        state.wake.changed(seen),
                        self.env.runtime.sleep(wait),
                    )
                    .await;
                    backoff = (backoff * 2).min(backoff_max);
                }
            }
        }
        tracing::debug!(parent = %key.parent, partition = key.partition, child = %key.child, "a copy ended");
        state.ended.set(true);
        // Ended but still listed (its topics were not in view for a moment):
        // leave the slot so the next reconcile starts it again.
        {
            let mut copies = self.copies.borrow_mut();
            if copies.get(&key).is_some_and(|s| Rc::ptr_eq(s, &state)) {
                copies.remove(&key);
            }
        }
        self.forget_cursor_if_unlinked(&key).await;
    }

    /// The parent, where the copy goes and their link, while the copy
    /// should run.
    fn copy_topics(&self, key: &CopyKey) -> Option<(Rc<Topic>, Target, Child)> {
        let parent = self
            .topic(&key.parent)
            .ok()
            .filter(|t| t.incarnation == key.parent_incarnation)?;
        let link = parent
            .children
            .get(&key.child)
            .filter(|c| c.incarnation == key.child_incarnation)?
            .clone();
        let target = match &link.kind {
            ChildKind::Remote { remote } => Target::Remote((**remote).clone()),
            _ => Target::Local(
                self.topic(&key.child)
                    .ok()
                    .filter(|t| t.incarnation == key.child_incarnation)?,
            ),
        };
        Some((parent, target, link))
    }

    fn cursor_place(&self, key: &CopyKey) -> (PathBuf, String) {
        let dir = self
            .topic_dir(&key.parent, key.parent_incarnation)
            .join(key.partition.to_string())
            .join("children");
        (
            dir,
            format!("{}-{}.cursor", key.child, key.child_incarnation),
        )
    }

    /// Copies from the cursor on until stopped; an error ends the attempt
    /// (the cursor stays where the last confirmed copy left it).
    async fn copy(
        &self,
        key: &CopyKey,
        state: &CopyState,
        observed: &mut Observed,
    ) -> Result<(), ApiError> {
        let Some((parent, _, link)) = self.copy_topics(key) else {
            return Ok(());
        };
        let owner = self.owner(&parent, key.partition).await?;
        let (dir, name) = self.cursor_place(key);
        let fs = &self.env.fs;
        let start = match Cursor::open(fs, &dir, &name).await {
            Ok(Some(cursor)) => Ok(cursor),
            Ok(None) => Err(self.first_to_copy(&owner, link.created_at_ms).await?),
            // Both slots damaged: copy all the parent still holds again
            // (duplicates, never a gap).
            Err(StorageError::BadFormat { path, detail }) => {
                tracing::error!(path = %path.display(), detail, "a child's cursor is damaged; copying again from the parent's oldest retained message");
                Err(owner.log_start_offset())
            }
            Err(error) => return Err(from_storage(&error)),
        };
        let cursor = match start {
            Ok(cursor) => cursor,
            Err(position) => Cursor::create(fs, &dir, &name, position)
                .await
                .map_err(|e| from_storage(&e))?,
        };
        // What to do next is `child_cursor.rs`'s to say: this loop reads,
        // commits and stores.
        let mut at = CopyCursor::new(cursor.position(), self.wall());
        loop {
            let seen = owner.version();
            let woken = state.wake.version();
            let now = self.wall();
            let ending = state.stop.get() || self.is_stopping();
            let Some((parent, target, link)) = self.copy_topics(key).filter(|_| !ending) else {
                if let Some(position) = at.unstored() {
                    cursor.store(position).await.map_err(|e| from_storage(&e))?;
                }
                return Ok(());
            };
            let high_watermark = owner.high_watermark();
            observed.note(high_watermark, now);
            let start = owner.log_start_offset();
            let lost = at.skip_to(start);
            if lost > 0 {
                state.dropped.set(state.dropped.get() + lost);
                tracing::warn!(parent = %key.parent, partition = key.partition, child = %key.child, skipped = lost, oldest_retained = start, "a child fell behind its parent's retention; skipped the messages retention removed");
            }
            observed.forget_below(at.position());
            let position = match at.next(now, high_watermark) {
                Next::Store(position) => {
                    cursor.store(position).await.map_err(|e| from_storage(&e))?;
                    at.stored(position, now);
                    continue;
                }
                Next::Idle { at_most, caught_up } => {
                    if caught_up {
                        state.lag_messages.set(0);
                        state.lag_ms.set(0);
                        if let Target::Remote(_) = target {
                            state.headroom_ms.set(Some(headroom_ms(
                                parent.config.retention_ms,
                                None,
                                now,
                            )));
                        }
                        *state.last_error.borrow_mut() = None;
                    }
                    self.idle(&owner, seen, state, woken, at_most).await;
                    continue;
                }
                Next::Read(position) => position,
            };
            let (records_max, bytes_max) = match &target {
                Target::Local(_) => (CHILD_COPY_RECORDS_MAX, CHILD_COPY_BYTES_MAX),
                Target::Remote(remote) => (
                    REMOTE_SHIP_RECORDS_MAX,
                    self.rate_share(&parent, remote)
                        .map_or(REMOTE_SHIP_BYTES_MAX, |share| {
                            usize::try_from(share / REMOTE_RATE_BATCH_DIVISOR)
                                .unwrap_or(usize::MAX)
                                .clamp(1, REMOTE_SHIP_BYTES_MAX)
                        }),
                ),
            };
            let batch = owner
                .read(position, records_max, bytes_max)
                .await
                .map_err(|e| from_owner(&e))?;
            let Some(first) = batch.first() else {
                // The log could not return the message at the cursor
                // (damaged, and already logged as such): go past it.
                state.dropped.set(state.dropped.get() + 1);
                at.skip_unreadable();
                continue;
            };
            state.lag_messages.set(high_watermark - position);
            if let Target::Remote(_) = target {
                state.headroom_ms.set(Some(headroom_ms(
                    parent.config.retention_ms,
                    Some(first.message.produced_at_ms),
                    now,
                )));
            }
            let delay_ms = match link.kind {
                ChildKind::Delay { delay_ms } => Some(delay_ms),
                ChildKind::Fanout | ChildKind::Replica | ChildKind::Remote { .. } => None,
            };
            let (due, oldest_due) = due_count(&batch, delay_ms, observed, now);
            state.lag_ms.set(now.saturating_sub(oldest_due));
            if due == 0 {
                tracing::trace!(parent = %key.parent, partition = key.partition, child = %key.child, position, high_watermark, oldest_due, now, "a delay copy waits");
                at.wait_until(oldest_due, now);
                continue;
            }
            let copied = batch.get(..due).unwrap_or_default();
            let sent = match &target {
                Target::Local(child) => {
                    self.copy_to_child(&parent, child, key.partition, copied)
                        .await
                }
                Target::Remote(remote) => self.ship(key, &parent, remote, copied).await,
            };
            if let Err(error) = sent {
                // Keep what was confirmed before this attempt failed.
                if let Some(position) = at.unstored() {
                    cursor.store(position).await.map_err(|e| from_storage(&e))?;
                }
                return Err(error);
            }
            let skipped = at.copied(copied.iter().map(|m| m.offset));
            if skipped > 0 {
                state.dropped.set(state.dropped.get() + skipped);
                tracing::warn!(parent = %key.parent, partition = key.partition, child = %key.child, skipped, "a child's copy went past messages its parent's log could not return");
            }
            *state.last_error.borrow_mut() = None;
        }
    }

    /// Waits for a commit to the parent partition, a stop, or `at_most`.
    async fn idle(
        &self,
        owner: &Owner<F>,
        seen: u64,
        state: &CopyState,
        woken: u64,
        at_most: Duration,
    ) {
        futures_lite::future::or(
            futures_lite::future::or(owner.changed(seen), state.wake.changed(woken)),
            self.env.runtime.sleep(at_most),
        )
        .await;
    }

    /// Commits messages of one parent partition to the child's partitions,
    /// each at its owner (fsynced and read back there); Ok once all are.
    async fn copy_to_child(
        &self,
        parent: &Topic,
        child: &Topic,
        partition: u32,
        messages: &[StoredMessage],
    ) -> Result<(), ApiError> {
        let mut groups: BTreeMap<u32, Vec<Record>> = BTreeMap::new();
        for stored in messages {
            let message = &stored.message;
            let to = child_partition(
                parent.config.partitions,
                child,
                partition,
                message.key.as_deref(),
            );
            groups.entry(to).or_default().push(Record {
                id: message.id,
                produced_at_ms: message.produced_at_ms,
                key: message.key.clone(),
                value: message.value.clone(),
            });
        }
        for (to, records) in groups {
            let op = Commit {
                topic: TopicRef::of(child),
                partition: to,
                messages: records,
            };
            self.commit(child, op.into(), Reach::Cluster).await?;
        }
        Ok(())
    }

    /// Sends messages of one parent partition to a remote child; Ok once the
    /// remote answered 202 for all of them.
    async fn ship(
        &self,
        key: &CopyKey,
        parent: &Topic,
        remote: &RemoteTarget,
        messages: &[StoredMessage],
    ) -> Result<(), ApiError> {
        let shipment = Shipment {
            lane: format!("{}/{}/{}", key.parent, key.child, key.child_incarnation),
            target: remote.clone(),
            messages: messages
                .iter()
                .map(|m| (m.message.key.clone(), m.message.value.clone()))
                .collect(),
            rate_bytes_per_s: self.rate_share(parent, remote),
        };
        self.env
            .ship
            .ship(shipment)
            .await
            .map_err(|message| ApiError::new(ErrorCode::OwnerUnreachable, message))
    }

    /// This node's share of a remote child's byte rate: in proportion to
    /// the parent partitions it owns (at least a byte a second).
    fn rate_share(&self, parent: &Topic, remote: &RemoteTarget) -> Option<u64> {
        let rate = remote.rate_bytes_per_s?;
        let total = parent.owners.len().max(1) as u64;
        let node = NodeId::from(self.identity.node_id);
        let mine = parent.owners.iter().filter(|o| **o == node).count().max(1) as u64;
        Some((u128::from(rate) * u128::from(mine) / u128::from(total)).max(1) as u64)
    }

    /// A seed for one retry's jitter: differs by copy and attempt, and
    /// repeats under a seeded simulation.
    fn jitter_seed(&self, key: &CopyKey, attempt: u64) -> u64 {
        let mut seed = self.identity.incarnation ^ attempt.rotate_left(32);
        for byte in key.parent.bytes().chain(key.child.bytes()) {
            seed = (seed ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        seed ^ u64::from(key.partition) ^ self.wall()
    }

    /// Where a new child's copy of this partition starts: the first message
    /// accepted after the child was created (less the clock slack), found
    /// going back from the end; at most the end of the partition now.
    async fn first_to_copy(&self, owner: &Owner<F>, created_at_ms: u64) -> Result<u64, ApiError> {
        let since = created_at_ms.saturating_sub(CHILD_START_CLOCK_SLACK_MS);
        let start = owner.log_start_offset();
        let mut first = owner.high_watermark();
        while first > start {
            let from = first
                .saturating_sub(CHILD_COPY_RECORDS_MAX as u64)
                .max(start);
            let read = owner
                .read(from, CHILD_COPY_RECORDS_MAX, CHILD_COPY_BYTES_MAX)
                .await
                .map_err(|e| from_owner(&e))?;
            let older = read
                .iter()
                .filter(|m| m.offset < first)
                .rev()
                .find(|m| m.message.produced_at_ms < since);
            if let Some(older) = older {
                return Ok(older.offset + 1);
            }
            first = from;
        }
        Ok(first)
    }

    /// Removes the cursor of a copy whose child link is gone (its parent
    /// stays), so a child created again starts afresh.
    async fn forget_cursor_if_unlinked(&self, key: &CopyKey) {
        let parent_stays = self
            .topic(&key.parent)
            .ok()
            .is_some_and(|t| t.incarnation == key.parent_incarnation);
        let linked = self.copy_topics(key).is_some();
        if !parent_stays || linked || !self.env.meta.caught_up() {
            return;
        }
        let (dir, name) = self.cursor_place(key);
        let path = dir.join(&name);
        if let Err(error) = self.env.fs.remove_file(&path).await {
            tracing::debug!(path = %path.display(), %error, "a child's cursor was not removed");
        }
    }
}

/// A wait from `min` to `ceiling`, spread by `seed` (splitmix64).
fn jittered(min: Duration, ceiling: Duration, seed: u64) -> Duration {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let low = min.min(ceiling).as_millis() as u64;
    let high = ceiling.as_millis() as u64;
    Duration::from_millis(low + z % (high - low + 1))
}

/// How long until a remote copy's oldest message not yet shipped
/// (`oldest_produced_at_ms`; none: nothing waits) ages out of a parent
/// that keeps messages `retention_ms` (0: forever, `u64::MAX` here).
fn headroom_ms(retention_ms: u64, oldest_produced_at_ms: Option<u64>, now_ms: u64) -> u64 {
    if retention_ms == 0 {
        return u64::MAX;
    }
    match oldest_produced_at_ms {
        None => retention_ms,
        Some(produced) => produced
            .saturating_add(retention_ms)
            .saturating_sub(now_ms)
            .min(retention_ms),
    }
}

/// Sums each child's copies over the parent's partitions.
pub fn child_statuses(parent: &Topic, copies: &[CopyFigures]) -> Vec<ChildStatus> {
    parent
        .children
        .iter()
        .map(|(name, link)| {
            let mine: Vec<&CopyFigures> = copies
                .iter()
                .filter(|c| c.parent == parent.name && c.child == *name)
                .collect();
            let lag_messages = mine.iter().map(|c| c.lag_messages).sum();
            let lag_ms = mine.iter().map(|c| c.lag_ms).max().unwrap_or(0);
            let last_error = mine.iter().find_map(|c| c.last_error.clone());
            let reported: HashSet<u32> = mine.iter().map(|c| c.partition).collect();
            let state = if last_error.is_some() {
                "failing"
            } else if lag_ms > CHILD_BEHIND_AFTER_MS
                || (reported.len() as u32) < parent.config.partitions
            {
                "behind"
            } else {
                "copying"
            };
            let last_error = last_error.or_else(|| {
                ((reported.len() as u32) < parent.config.partitions).then(|| {
                    format!(
                        "{} of {} parent partitions did not report (their owner is unreachable or still starting the copy)",
                        parent.config.partitions as usize - reported.len(),
                        parent.config.partitions
                    )
                })
            });
            ChildStatus {
                name: name.clone(),
                kind: link.kind.clone(),
                lag_messages,
                lag_seconds: lag_ms as f64 / 1000.0,
                dropped_messages: mine.iter().map(|c| c.dropped).sum(),
                state,
                last_error,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_with_the_parents_count_keep_partitions_others_go_by_key() {
        let topic = |partitions| Topic {
            name: "c".into(),
            config: TopicConfig {
                partitions,
                visibility_timeout_ms: 1,
                retention_ms: 0,
                max_deliveries: 0,
                dead_letter_topic: None,
                schema: None,
                max_message_bytes: 1,
                idempotency_window_ms: 0,
            },
            owners: vec![1; partitions as usize],
            incarnation: 1,
            created_at_ms: 0,
            children: BTreeMap::new(),
            parent: None,
        };
        assert_eq!(child_partition(4, &topic(4), 3, Some(b"k")), 3);
        assert_eq!(
            child_partition(4, &topic(3), 3, Some(b"k")),
            partition_for_key(b"k", 3)
        );
        assert_eq!(child_partition(4, &topic(3), 3, None), 0);
    }
}

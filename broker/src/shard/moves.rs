//! Partition moves, both ends. The destination's shard that will own the
//! partition runs the move: it starts a planned move through the metastore
//! (which keeps at most `cluster.max_concurrent_moves` running), copies the
//! source's segments into `{partition}.incoming` while the source serves
//! (at no more than `cluster.move_bytes_per_s`), then asks the source to
//! freeze the partition: commits there wait, acks and nacks are refused
//! retryably, consumes find nothing. It copies the rest, writes the ack set
//! and the children's cursors the source answered, puts the folder in
//! place, opens the partition, and hands ownership over through the
//! metastore. Leases the source granted end with it (their receipts answer
//! 410 at the new owner), so those messages are delivered again; acks and
//! the frontier carry over. A move that fails before the handover is
//! abandoned: the source thaws and nothing changed. A source frozen for
//! `MOVE_FREEZE_MAX` abandons the move itself, through the metastore, so
//! that only one of the handover and the abandon can apply.

use narad_raft::moves::plan_balance;
use narad_raft::node::MemberChange;
use narad_raft::state::{Move, MoveEnd, MoveState};
use narad_storage::consumer::{write_initial, AckSet};
use narad_storage::cursor::Cursor;
use narad_storage::log::copy::{sync_copied, write_copied, CopyProgress};
use narad_storage::log::SegmentExtent;
use std::path::Path;

use super::redrive::Bucket;
use super::*;
use crate::limits::{
    MOVES_PER_PLAN_MAX, MOVE_CALL_TIMEOUT, MOVE_CHUNK_BYTES, MOVE_FREEZE_BELOW_BYTES,
    MOVE_FREEZE_MAX, MOVE_POLL_INTERVAL, MOVE_PROGRESS_INTERVAL_MS, MOVE_RETRY_BACKOFF_MAX,
    MOVE_RETRY_BACKOFF_MIN,
};
use crate::metric_names::{MOVES_IN_PROGRESS, MOVE_COPIED_BYTES_TOTAL};
use crate::rpc::{MoveAction, MoveSource, SourceAnswer, SourceState};

/// This shard's part in moves.
#[derive(Default)]
pub(super) struct Moves {
    /// Partitions of this shard frozen for a handover: the move's id and
    /// when the freeze began.
    frozen: RefCell<HashMap<OwnerKey, (String, u64)>>,
    /// Raised when a freeze ends (thawed, or the partition moved away).
    thawed: Signal,
    /// Moves this shard runs as their destination.
    running: RefCell<HashSet<String>>,
}

impl<F: FileSystem> Shard<F> {
    // ------------------------------------------------------------ source

    /// Whether a partition of this shard is frozen for a handover.
    pub(super) fn is_frozen(&self, topic: &Topic, partition: u32) -> bool {
        let frozen = self.moves.frozen.borrow();
        !frozen.is_empty()
            && frozen.contains_key(&(topic.name.clone(), topic.incarnation, partition))
    }

    pub(super) fn moving_error(topic: &Topic, partition: u32) -> ApiError {
        ApiError::new(
            ErrorCode::PartitionMoving,
            format!(
                "partition {partition} of {:?} is being handed over to another node; retry",
                topic.name
            ),
        )
    }

    /// Before a commit appends: waits while the partition is frozen. Once
    /// the freeze ends, the commit goes on if this shard still owns the
    /// partition; if it moved away, the commit is refused retryably and its
    /// dispatcher sends it to the new owner.
    pub(super) async fn wait_unfrozen(
        &self,
        topic: &Topic,
        partition: u32,
    ) -> Result<(), ApiError> {
        while self.is_frozen(topic, partition) {
            let seen = self.moves.thawed.version();
            if !self.is_frozen(topic, partition) {
                break;
            }
            self.moves.thawed.changed(seen).await;
        }
        let current = self.topic(&topic.name)?;
        if current.incarnation != topic.incarnation
            || self.placement(&current).locate(partition) != Location::Here
        {
            return Err(Self::moving_error(topic, partition));
        }
        Ok(())
    }

    /// Answers a move's destination: the partition's state and the bytes
    /// it asked for; a freeze first waits for the append under way and the
    /// copies to children of the partition to store their cursors.
    pub(super) async fn serve_move_source(&self, op: MoveSource) -> SourceAnswer {
        let topic = self.topic_at(&op.topic)?;
        if self.placement(&topic).locate(op.partition) != Location::Here {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "node {} does not own partition {} of {:?}",
                    self.me(),
                    op.partition,
                    topic.name
                ),
            ));
        }
        let key = (topic.name.clone(), topic.incarnation, op.partition);
        let owner = self.owner(&topic, op.partition).await?;
        let mut state = SourceState::default();
        match op.action {
            MoveAction::Thaw => {
                let thawed = self.moves.frozen.borrow_mut().remove(&key).is_some();
                owner.thaw();
                if thawed {
                    tracing::info!(topic = %topic.name, partition = op.partition, id = %op.move_id, "move abandoned: the partition serves again");
                    self.moves.thawed.notify();
                }
                return Ok(state);
            }
            MoveAction::Freeze => {
                let fresh = self
                    .moves
                    .frozen
                    .borrow_mut()
                    .insert(key.clone(), (op.move_id.clone(), self.now()))
                    .is_none();
                if fresh {
                    tracing::info!(topic = %topic.name, partition = op.partition, id = %op.move_id, "freezing the partition for its handover");
                }
                // Its copies to children stop and store their cursors.
                self.stop_copies_of(&key, MOVE_CALL_TIMEOUT / 2).await;
                owner.freeze().await;
                state.recent = owner.recent_ids();
            }
            MoveAction::Read(Some((ref name, pos, len))) => {
                state.bytes = owner
                    .read_segment(name, pos, len.min(MOVE_CHUNK_BYTES))
                    .await
                    .map_err(|e| from_owner(&e))?;
            }
            MoveAction::Read(None) => {}
        }
        state.extents = owner
            .segment_extents()
            .into_iter()
            .map(|e| (e.name, e.written))
            .collect();
        state.acks = owner.ack_set().encode();
        state.high_watermark = owner.high_watermark();
        state.cursors = self.cursors_of(&topic, op.partition).await;
        Ok(state)
    }

    /// The stored cursors of the copies of a partition to its children.
    async fn cursors_of(&self, topic: &Topic, partition: u32) -> Vec<(String, u64, u64)> {
        let dir = self
            .topic_dir(&topic.name, topic.incarnation)
            .join(partition.to_string())
            .join("children");
        let mut cursors = Vec::new();
        for (child, link) in &topic.children {
            let name = format!("{child}-{}.cursor", link.incarnation);
            if let Ok(Some(cursor)) = Cursor::open(&self.env.fs, &dir, &name).await {
                cursors.push((child.clone(), link.incarnation, cursor.position()));
            }
        }
        cursors
    }

    /// A frozen partition whose handover did not come within
    /// `MOVE_FREEZE_MAX` abandons its move through the metastore, and
    /// serves again only if that applied (else the handover did, and the
    /// metadata's change ends the freeze).
    async fn end_stuck_freezes(&self) {
        let now = self.now();
        let stuck: Vec<(OwnerKey, String)> = self
            .moves
            .frozen
            .borrow()
            .iter()
            .filter(|(_, (_, at))| now.saturating_sub(*at) >= MOVE_FREEZE_MAX.as_millis() as u64)
            .map(|(key, (id, _))| (key.clone(), id.clone()))
            .collect();
        for (key, id) in stuck {
            let end = Command::EndMove {
                id: id.clone(),
                end: MoveEnd::Abandoned {
                    reason: format!("no handover within {MOVE_FREEZE_MAX:?} of the freeze"),
                },
                now_ms: now,
            };
            match self.env.meta.propose(end).await {
                Ok(_) => {
                    tracing::warn!(
                        id,
                        "the move's handover did not come: abandoned, the partition serves again"
                    );
                    self.thaw_if(&key, &id);
                }
                Err(narad_raft::node::MetaError::Refused(_)) => self.reconcile_moves(),
                Err(error) => tracing::warn!(id, %error, "could not abandon a stuck move yet"),
            }
        }
    }

    fn thaw_if(&self, key: &OwnerKey, id: &str) {
        let mut frozen = self.moves.frozen.borrow_mut();
        if frozen
            .get(key)
            .is_some_and(|(frozen_by, _)| frozen_by == id)
        {
            frozen.remove(key);
            drop(frozen);
            if let Some(OwnerSlot::Ready(owner)) = self.owners.slots.borrow().get(key) {
                owner.thaw();
            }
            self.moves.thawed.notify();
        }
    }

    /// On every metadata change: a frozen partition that moved away stops
    /// being served here (its owner slot goes), and one whose move was
    /// abandoned serves again.
    pub(super) fn reconcile_moves(&self) {
        let view = self.view();
        let mut ended = Vec::new();
        for (key, (id, _)) in self.moves.frozen.borrow().iter() {
            let handed_over = view.state.topics.get(&key.0).is_none_or(|t| {
                t.incarnation != key.1 || t.owners.get(key.2 as usize) != Some(&self.me())
            });
            let abandoned = view
                .state
                .moves
                .get(id)
                .is_none_or(|m| m.state == MoveState::Abandoned);
            if handed_over || abandoned {
                ended.push((key.clone(), handed_over));
            }
        }
        let mut slots = self.owners.slots.borrow_mut();
        // Partitions this node no longer owns are not served from here.
        slots.retain(|(name, incarnation, partition), _| {
            view.state.topics.get(name).is_none_or(|t| {
                t.incarnation != *incarnation
                    || t.owners.get(*partition as usize) == Some(&self.me())
                    || self.moves.running.borrow().iter().any(|id| {
                        view.state
                            .moves
                            .get(id)
                            .is_some_and(|m| m.topic == *name && m.partition == *partition)
                    })
            })
        });
        drop(slots);
        if ended.is_empty() {
            return;
        }
        let mut frozen = self.moves.frozen.borrow_mut();
        for (key, handed_over) in ended {
            frozen.remove(&key);
            if handed_over {
                tracing::info!(topic = %key.0, partition = key.2, "partition handed over to its new owner");
            } else if let Some(OwnerSlot::Ready(owner)) = self.owners.slots.borrow().get(&key) {
                owner.thaw();
            }
        }
        drop(frozen);
        self.moves.thawed.notify();
    }

    // ------------------------------------------------------------ destination

    /// Each shard: starts the planned moves whose partition it will own,
    /// and resumes (from the start) those it ran before a restart.
    pub async fn run_moves(self: Rc<Self>) {
        loop {
            if self.is_stopping() {
                return;
            }
            if self.env.meta.caught_up() {
                // Also restarts the copies to children of a partition that
                // thawed.
                self.reconcile_children();
                self.end_stuck_freezes().await;
                self.start_moves().await;
                self.reap_moved_away().await;
            }
            self.env.runtime.sleep(MOVE_POLL_INTERVAL).await;
        }
    }

    async fn start_moves(self: &Rc<Self>) {
        let view = self.view();
        let mine: Vec<Move> = view
            .state
            .moves
            .values()
            .filter(|m| m.to == self.me() && m.state.is_active())
            .filter(|m| !self.moves.running.borrow().contains(&m.id))
            .filter(|m| {
                crate::mesh::shard_for(&m.topic, m.partition, usize::from(self.identity.shards))
                    == self.shard_index()
            })
            .cloned()
            .collect();
        for planned in mine {
            if planned.state == MoveState::Planned {
                let start = Command::StartMove {
                    id: planned.id.clone(),
                    max_running: u32::try_from(self.settings.cluster.max_concurrent_moves)
                        .unwrap_or(u32::MAX),
                    now_ms: self.now(),
                };
                match self.env.meta.propose(start).await {
                    Ok(Applied::MoveChanged(m)) if m.state == MoveState::Copying => {}
                    Ok(_) | Err(_) => continue,
                }
            }
            self.moves.running.borrow_mut().insert(planned.id.clone());
            let shard = self.clone();
            self.env.runtime.spawn(Box::pin(async move {
                shard.execute_move(planned).await;
            }));
        }
    }

    async fn execute_move(self: Rc<Self>, planned: Move) {
        let id = planned.id.clone();
        tracing::info!(id, topic = %planned.topic, partition = planned.partition, from = planned.from, to = planned.to, "move started");
        metrics::gauge!(MOVES_IN_PROGRESS).increment(1.0);
        let outcome = self.carry_out(&planned).await;
        metrics::gauge!(MOVES_IN_PROGRESS).decrement(1.0);
        match outcome {
            Ok(()) => tracing::info!(id, "move done: the partition is owned here"),
            Err(error) => {
                tracing::warn!(id, %error, "move abandoned");
                self.abandon(&planned, &error.message).await;
            }
        }
        self.moves.running.borrow_mut().remove(&id);
    }

    /// Ends a move that failed before its handover: the metastore first (so
    /// the handover can no longer apply), then the source thaws and the
    /// copy goes.
    async fn abandon(&self, planned: &Move, reason: &str) {
        let end = Command::EndMove {
            id: planned.id.clone(),
            end: MoveEnd::Abandoned {
                reason: reason.to_string(),
            },
            now_ms: self.now(),
        };
        let _ = self.env.meta.propose(end).await;
        let thaw = MoveSource {
            topic: TopicRef {
                name: planned.topic.clone(),
                incarnation: planned.incarnation,
            },
            partition: planned.partition,
            move_id: planned.id.clone(),
            action: MoveAction::Thaw,
        };
        let _ = self
            .call(Address::Node(planned.from), thaw, Some(MOVE_CALL_TIMEOUT))
            .await;
        let dir = self.move_dirs(planned).1;
        let _ = self.env.fs.remove_dir_all(&dir).await;
    }

    /// The partition's folder and the folder its copy grows in.
    fn move_dirs(&self, planned: &Move) -> (PathBuf, PathBuf) {
        let topic_dir = self.topic_dir(&planned.topic, planned.incarnation);
        (
            topic_dir.join(planned.partition.to_string()),
            topic_dir.join(format!("{}.incoming", planned.partition)),
        )
    }

    async fn ask_source(&self, planned: &Move, action: MoveAction) -> SourceAnswer {
        let op = MoveSource {
            topic: TopicRef {
                name: planned.topic.clone(),
                incarnation: planned.incarnation,
            },
            partition: planned.partition,
            move_id: planned.id.clone(),
            action,
        };
        let to = Address::Node(planned.from);
        self.call(to, op, Some(MOVE_CALL_TIMEOUT))
            .await
            .map_err(|e| e.to_api(to))?
    }

    /// Asks the source, trying again (with backoff) while it does not
    /// answer, for as long as the move stays this shard's to run.
    async fn ask_source_patiently(&self, planned: &Move, action: MoveAction) -> SourceAnswer {
        let mut backoff = MOVE_RETRY_BACKOFF_MIN;
        loop {
            match self.ask_source(planned, action.clone()).await {
                Ok(state) => return Ok(state),
                Err(error) if error.code.retry() && !self.is_stopping() => {
                    let still_running = self
                        .view()
                        .state
                        .moves
                        .get(&planned.id)
                        .is_some_and(|m| m.state.is_running());
                    if !still_running {
                        return Err(error);
                    }
                    tracing::debug!(id = planned.id, %error, "the move's source did not answer; trying again");
                    self.env.runtime.sleep(backoff).await;
                    backoff = (backoff * 2).min(MOVE_RETRY_BACKOFF_MAX);
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Copies until less than `until` bytes are missing; answers the
    /// source's last state.
    async fn copy_from_source(
        &self,
        planned: &Move,
        incoming: &Path,
        progress: &mut CopyProgress,
        bucket: &mut Bucket,
        until: u64,
        mut state: SourceState,
    ) -> Result<SourceState, ApiError> {
        let mut reported_at = self.now();
        loop {
            let extents: Vec<SegmentExtent> = state
                .extents
                .iter()
                .map(|(name, written)| SegmentExtent {
                    name: name.clone(),
                    written: *written,
                })
                .collect();
            for name in progress.drop_stale(&extents) {
                let _ = self.env.fs.remove_file(&incoming.join(name)).await;
            }
            let remaining = progress.remaining(&extents);
            if self.now().saturating_sub(reported_at) >= MOVE_PROGRESS_INTERVAL_MS {
                reported_at = self.now();
                self.report_progress(planned, progress.copied_bytes(), remaining, false)
                    .await;
            }
            let next = progress.next_read(&extents, MOVE_CHUNK_BYTES);
            let Some(read) = next.filter(|_| remaining >= until.max(1)) else {
                return Ok(state);
            };
            // At most `cluster.move_bytes_per_s`.
            loop {
                let now = self.now();
                if bucket.available(now) >= read.len.min(self.settings.cluster.move_bytes_per_s) {
                    break;
                }
                let wait = bucket.wait_ms().max(1);
                self.env.runtime.sleep(Duration::from_millis(wait)).await;
            }
            bucket.take(read.len);
            let asked = MoveAction::Read(Some((read.name.clone(), read.pos, read.len)));
            state = self.ask_source_patiently(planned, asked).await?;
            if !state.bytes.is_empty() {
                write_copied(&self.env.fs, incoming, &read.name, read.pos, &state.bytes)
                    .await
                    .map_err(|e| from_storage(&e))?;
                progress.record(&read.name, read.pos, state.bytes.len() as u64);
                metrics::counter!(MOVE_COPIED_BYTES_TOTAL).increment(state.bytes.len() as u64);
                state.bytes = Vec::new();
            }
        }
    }

    async fn report_progress(&self, planned: &Move, copied: u64, remaining: u64, freezing: bool) {
        let elapsed_ms = self
            .now()
            .saturating_sub(planned.started_at_ms.unwrap_or(planned.planned_at_ms))
            .max(1);
        let progress = Command::MoveProgress {
            id: planned.id.clone(),
            copied_bytes: copied,
            total_bytes: copied + remaining,
            rate_bytes_per_s: copied.saturating_mul(1000) / elapsed_ms,
            freezing,
        };
        if let Err(error) = self.env.meta.propose(progress).await {
            tracing::debug!(id = planned.id, %error, "a move's progress was not recorded");
        }
    }

    async fn carry_out(self: &Rc<Self>, planned: &Move) -> Result<(), ApiError> {
        let topic = self
            .topic(&planned.topic)
            .ok()
            .filter(|t| t.incarnation == planned.incarnation)
            .ok_or_else(|| ApiError::new(ErrorCode::Conflict, "the topic was deleted"))?;
        let (dir, incoming) = self.move_dirs(planned);
        let fs = &self.env.fs;
        fs.remove_dir_all(&incoming)
            .await
            .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
        fs.create_dir_all(&incoming)
            .await
            .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
        let mut progress = CopyProgress::default();
        let rate = self.settings.cluster.move_bytes_per_s;
        let mut bucket = Bucket::new(rate, self.now());
        // While the source serves.
        let state = self
            .ask_source_patiently(planned, MoveAction::Read(None))
            .await?;
        self.copy_from_source(
            planned,
            &incoming,
            &mut progress,
            &mut bucket,
            MOVE_FREEZE_BELOW_BYTES,
            state,
        )
        .await?;
        // The handover.
        self.report_progress(planned, progress.copied_bytes(), 0, true)
            .await;
        let froze_at = self.now();
        let frozen = self.ask_source(planned, MoveAction::Freeze).await?;
        let recent = frozen.recent.clone();
        let mut unlimited = Bucket::new(u64::MAX / 4, self.now());
        let last = self
            .copy_from_source(planned, &incoming, &mut progress, &mut unlimited, 0, frozen)
            .await?;
        sync_copied(fs, &incoming, progress.names())
            .await
            .map_err(|e| from_storage(&e))?;
        let acks = AckSet::decode(&last.acks).ok_or_else(|| {
            ApiError::new(ErrorCode::Internal, "the source's ack set arrived damaged")
        })?;
        write_initial(fs, &incoming.join("consumer"), &acks)
            .await
            .map_err(|e| from_storage(&e))?;
        let children = incoming.join("children");
        for (child, incarnation, position) in &last.cursors {
            Cursor::create(
                fs,
                &children,
                &format!("{child}-{incarnation}.cursor"),
                *position,
            )
            .await
            .map_err(|e| from_storage(&e))?;
        }
        // The copy takes the partition's place here, and opens.
        let internal = |e: std::io::Error| ApiError::new(ErrorCode::Internal, e.to_string());
        fs.remove_dir_all(&dir).await.map_err(internal)?;
        fs.rename(&incoming, &dir).await.map_err(internal)?;
        if let Some(parent) = dir.parent() {
            fs.sync_dir(parent).await.map_err(internal)?;
        }
        let owner = self.owner(&topic, planned.partition).await?;
        owner.remember_recent(&recent);
        if owner.high_watermark() != last.high_watermark {
            return Err(ApiError::new(
                ErrorCode::Internal,
                format!(
                    "the copy ends at offset {}, the source at {}",
                    owner.high_watermark(),
                    last.high_watermark
                ),
            ));
        }
        self.hand_over(planned).await?;
        let freeze_ms = self.now().saturating_sub(froze_at);
        metrics::histogram!(crate::metric_names::MOVE_FREEZE_SECONDS)
            .record(freeze_ms as f64 / 1000.0);
        tracing::info!(
            id = planned.id,
            freeze_ms,
            bytes = progress.copied_bytes(),
            "partition handed over"
        );
        Ok(())
    }

    /// Proposes the handover until the metastore says how the move ended.
    async fn hand_over(&self, planned: &Move) -> Result<(), ApiError> {
        loop {
            let end = Command::EndMove {
                id: planned.id.clone(),
                end: MoveEnd::Done,
                now_ms: self.now(),
            };
            match self.env.meta.propose(end).await {
                Ok(_) => return Ok(()),
                Err(narad_raft::node::MetaError::Refused(refused)) => {
                    let done = self
                        .view()
                        .state
                        .moves
                        .get(&planned.id)
                        .is_some_and(|m| m.state == MoveState::Done);
                    if done {
                        return Ok(());
                    }
                    // The copy must not stay where a later owner may look.
                    let key = (
                        planned.topic.clone(),
                        planned.incarnation,
                        planned.partition,
                    );
                    self.owners.slots.borrow_mut().remove(&key);
                    let _ = self.env.fs.remove_dir_all(&self.move_dirs(planned).0).await;
                    return Err(from_meta(&narad_raft::node::MetaError::Refused(refused)));
                }
                // Unknown outcome: ask again (a second handover is refused
                // and the state says which happened).
                Err(error) => {
                    tracing::warn!(id = planned.id, %error, "the handover's outcome is unknown; asking again");
                    self.env.runtime.sleep(MOVE_RETRY_BACKOFF_MIN).await;
                }
            }
        }
    }

    /// Removes the folders of partitions this shard handed over.
    async fn reap_moved_away(&self) {
        let view = self.view();
        let shards = usize::from(self.identity.shards);
        for done in view.state.moves.values().filter(|m| {
            m.from == self.me()
                && m.state == MoveState::Done
                && crate::mesh::shard_for(&m.topic, m.partition, shards) == self.shard_index()
        }) {
            let owned_here = view.state.topics.get(&done.topic).is_some_and(|t| {
                t.incarnation == done.incarnation
                    && t.owners.get(done.partition as usize) == Some(&self.me())
            });
            if owned_here {
                continue;
            }
            let dir = self.move_dirs(done).0;
            if self.env.fs.exists(&dir).await.unwrap_or(false) {
                match self.env.fs.remove_dir_all(&dir).await {
                    Ok(()) => {
                        tracing::info!(dir = %dir.display(), "removed a partition handed over to another node")
                    }
                    Err(error) => {
                        tracing::warn!(dir = %dir.display(), %error, "could not remove a partition handed over")
                    }
                }
            }
        }
    }

    // ------------------------------------------------------------ cluster actions

    /// `POST /v1/cluster/rebalance`: moves that even partitions over the
    /// live nodes (and off nodes being decommissioned).
    pub async fn rebalance(&self) -> Result<Vec<Move>, ApiError> {
        let view = self.view();
        let nodes = self.live_nodes();
        let drain: Vec<NodeId> = view
            .state
            .nodes
            .iter()
            .filter(|(_, r)| r.decommissioning)
            .map(|(id, _)| *id)
            .collect();
        let plans = plan_balance(&view.state, &nodes, &drain, MOVES_PER_PLAN_MAX);
        self.plan(plans, None).await
    }

    /// `POST /v1/cluster/nodes/{id}/decommission`: every partition of the
    /// node moves to the others; it takes no new ones.
    pub async fn decommission(&self, node: NodeId) -> Result<Vec<Move>, ApiError> {
        let view = self.view();
        if !view.state.nodes.contains_key(&node) {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("node {node} is not a member of the cluster"),
            ));
        }
        let nodes: Vec<NodeId> = self
            .live_nodes()
            .into_iter()
            .filter(|n| *n != node)
            .collect();
        if nodes.is_empty() {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("node {node} is the only live node; nothing could take its partitions"),
            ));
        }
        let plans = plan_balance(&view.state, &nodes, &[node], MOVES_PER_PLAN_MAX);
        self.plan(plans, Some(node)).await
    }

    async fn plan(
        &self,
        plans: Vec<narad_raft::state::MovePlan>,
        decommission: Option<NodeId>,
    ) -> Result<Vec<Move>, ApiError> {
        if plans.is_empty() && decommission.is_none() {
            return Ok(Vec::new());
        }
        let command = Command::PlanMoves {
            moves: plans,
            decommission,
            now_ms: self.now(),
        };
        match self
            .env
            .meta
            .propose(command)
            .await
            .map_err(|e| from_meta(&e))?
        {
            Applied::MovesPlanned(moves) => Ok(moves),
            _ => Ok(Vec::new()),
        }
    }

    /// `POST /v1/cluster/nodes`: admits a node as a learner.
    pub async fn admit_node(&self, id: NodeId, addr: String) -> Result<(), ApiError> {
        self.env
            .meta
            .change_members(MemberChange::Admit { id, addr })
            .await
            .map(|_| ())
            .map_err(|e| from_meta(&e))
    }

    /// `DELETE /v1/cluster/nodes/{id}`.
    pub async fn remove_node(&self, id: NodeId) -> Result<(), ApiError> {
        self.env
            .meta
            .change_members(MemberChange::Remove { id })
            .await
            .map(|_| ())
            .map_err(|e| from_meta(&e))
    }
}

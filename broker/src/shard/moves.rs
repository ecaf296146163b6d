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
use narad_storage::log::copy::{sync_copied, write_copied, VerifiedCopy};
use std::path::Path;

use super::move_copy::{MoveCopy, Step};
use super::*;
use crate::limits::{
    DECOMMISSION_REPLAN_INTERVAL_MS, MOVES_PER_PLAN_MAX, MOVE_CALL_TIMEOUT, MOVE_CHUNK_BYTES,
    MOVE_FREEZE_MAX, MOVE_HOLD_POLL, MOVE_POLL_INTERVAL, MOVE_PROMOTION_CHECK,
    MOVE_RETRY_BACKOFF_MAX, MOVE_RETRY_BACKOFF_MIN,
};
use crate::metric_names::{MOVES_IN_PROGRESS, MOVE_COPIED_BYTES_TOTAL};
use crate::rpc::{MoveAction, MoveSource, SourceAnswer, SourceState};

/// A move this shard runs: where its copy grows, the copy's state machine
/// (what it copied and the source's last answer: the ack set, cursors and
/// recent ids a handover or a promotion installs), and what of the copy
/// was read back and checked (so that the handover checks only the bytes
/// copied during the freeze).
struct MoveRun {
    planned: Move,
    dir: PathBuf,
    incoming: PathBuf,
    copy: MoveCopy,
    verified: VerifiedCopy,
}

/// Why a move stopped short of its handover.
enum Stalled {
    Failed(ApiError),
    /// The source has been dead for `cluster.move_promote_after_ms`.
    SourceGone,
}

impl From<ApiError> for Stalled {
    fn from(error: ApiError) -> Self {
        Stalled::Failed(error)
    }
}

/// This shard's part in moves.
#[derive(Default)]
pub(super) struct Moves {
    /// Partitions of this shard frozen for a handover: the move's id and
    /// when the freeze began.
    frozen: RefCell<BTreeMap<OwnerKey, (String, u64)>>,
    /// Raised when a freeze ends (thawed, or the partition moved away).
    thawed: Signal,
    /// Moves this shard runs as their destination.
    running: RefCell<HashSet<String>>,
    /// Partitions whose copy this shard opened for a handover that the
    /// metastore has not applied yet.
    installing: RefCell<HashSet<OwnerKey>>,
    /// A copy being installed: what of it was verified, for the open of
    /// its log (taken by the open).
    verified: RefCell<HashMap<OwnerKey, VerifiedCopy>>,
    /// When a decommission's remaining partitions were last planned again.
    replanned_at: Cell<u64>,
    /// Moves seen handed over (or promoted) in the metadata.
    handed_over: RefCell<HashSet<String>>,
}

impl<F: FileSystem> Shard<F> {
    // ------------------------------------------------------------ source

    /// Whether this shard serves a partition now: the metastore says it
    /// owns it, or it is installing a move's copy of it. A request routed
    /// here before the partition moved away finds it gone, not its old
    /// folder.
    pub(super) fn serves(&self, topic: &Topic, partition: u32) -> bool {
        let owned = self.topic(&topic.name).is_ok_and(|current| {
            current.incarnation == topic.incarnation
                && self.placement(&current).locate(partition) == Location::Here
        });
        owned || {
            let installing = self.moves.installing.borrow();
            !installing.is_empty()
                && installing.contains(&(topic.name.clone(), topic.incarnation, partition))
        }
    }

    /// Whether a partition moved here (a receipt its old owner issued is
    /// one of a lease the move ended).
    pub(super) fn moved_here(&self, topic: &Topic, partition: u32) -> bool {
        self.view().state.moves.values().any(|m| {
            m.topic == topic.name
                && m.incarnation == topic.incarnation
                && m.partition == partition
                && m.to == self.me()
                && matches!(m.state, MoveState::Done | MoveState::Promoted)
        })
    }

    /// What was verified of a move's copy being installed as `key`.
    pub(super) fn moves_verified(&self, key: &OwnerKey) -> Option<VerifiedCopy> {
        self.moves.verified.borrow_mut().remove(key)
    }

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

    /// Waits until `frozen` answers false, looking each time a freeze ends,
    /// for at most `max`.
    pub(super) async fn wait_for_thaw(&self, max: Duration, frozen: impl Fn() -> bool) {
        if self.moves.frozen.borrow().is_empty() || !frozen() {
            return;
        }
        let deadline = self.mono().saturating_add(max.as_millis() as u64);
        loop {
            let seen = self.moves.thawed.version();
            let left = deadline.saturating_sub(self.mono());
            if !frozen() || left == 0 {
                return;
            }
            futures_lite::future::or(
                self.moves.thawed.changed(seen),
                self.env.runtime.sleep(Duration::from_millis(left)),
            )
            .await;
        }
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
        let mut state = SourceState {
            incarnation: self.identity.incarnation,
            ..SourceState::default()
        };
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
                    .insert(key.clone(), (op.move_id.clone(), self.mono()))
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
        let now = self.mono();
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
                now_ms: self.wall(),
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
        self.freeze_handovers_under_way(&view.state);
        self.wake_polls_on_handovers(&view.state);
        let mut ended = Vec::new();
        for (key, (id, since)) in self.moves.frozen.borrow().iter() {
            let handed_over = view.state.topics.get(&key.0).is_none_or(|t| {
                t.incarnation != key.1 || t.owners.get(key.2 as usize) != Some(&self.me())
            });
            let abandoned = view
                .state
                .moves
                .get(id)
                .is_none_or(|m| m.state == MoveState::Abandoned);
            if handed_over || abandoned {
                ended.push((key.clone(), handed_over, *since));
            }
        }
        let mut slots = self.owners.slots.borrow_mut();
        // Partitions this node no longer owns are not served from here.
        let installing = self.moves.installing.borrow();
        slots.retain(|key, _| {
            view.state.topics.get(&key.0).is_none_or(|t| {
                t.incarnation != key.1
                    || t.owners.get(key.2 as usize) == Some(&self.me())
                    || installing.contains(key)
            })
        });
        drop(installing);
        drop(slots);
        if ended.is_empty() {
            return;
        }
        let mut frozen = self.moves.frozen.borrow_mut();
        for (key, handed_over, since) in ended {
            frozen.remove(&key);
            if handed_over {
                // How long commits here waited (the destination's
                // `freeze_ms` plus this node's apply of the handover).
                let frozen_ms = self.mono().saturating_sub(since);
                tracing::info!(topic = %key.0, partition = key.2, frozen_ms, "partition handed over to its new owner");
            } else if let Some(OwnerSlot::Ready(owner)) = self.owners.slots.borrow().get(&key) {
                owner.thaw();
            }
        }
        drop(frozen);
        self.moves.thawed.notify();
    }

    /// A partition that changed owner, once this node applied it: long
    /// polls here that found nothing ask again, now of its new owner; and
    /// the new owner tells every node it has messages. Both wait for the
    /// local apply: a node asked before it applied the handover answers
    /// for the old placement, and finds nothing.
    fn wake_polls_on_handovers(&self, state: &MetaState) {
        let mut seen = self.moves.handed_over.borrow_mut();
        let mut new = false;
        let mut here = Vec::new();
        for m in state.moves.values() {
            if matches!(m.state, MoveState::Done | MoveState::Promoted) && !seen.contains(&m.id) {
                seen.insert(m.id.clone());
                new = true;
                // What the new owner held of the topic before may have
                // been empty; now it holds this partition too. Its notice
                // that messages are there may have come before this node
                // applied the handover (and before a consume found it
                // empty), so forget the hint rather than skip it.
                if let Some(peers) = &self.remote.peers {
                    peers.found_messages(m.to, &m.topic);
                }
                if m.to == self.me()
                    && crate::mesh::shard_for(
                        &m.topic,
                        m.partition,
                        usize::from(self.identity.shards),
                    ) == self.shard_index()
                {
                    here.push(m.topic.clone());
                }
            }
        }
        // Ended moves the metastore no longer keeps are forgotten here too.
        seen.retain(|id| state.moves.contains_key(id));
        drop(seen);
        if new {
            self.wake_every_poll();
        }
        // Partitions handed to this shard: their messages are here now.
        for topic in here {
            self.announce_available(&topic, EVERY_POLL);
        }
    }

    /// A freeze lives in memory: a source that restarted while its
    /// partition's handover was under way (the move says `freezing`) takes
    /// the freeze up again, so nothing is appended there that the
    /// destination might not copy.
    fn freeze_handovers_under_way(&self, state: &MetaState) {
        let shards = usize::from(self.identity.shards);
        let now = self.mono();
        for handover in state.moves.values().filter(|m| {
            m.state == MoveState::Freezing
                && m.from == self.me()
                && crate::mesh::shard_for(&m.topic, m.partition, shards) == self.shard_index()
        }) {
            let key = (
                handover.topic.clone(),
                handover.incarnation,
                handover.partition,
            );
            let fresh = !self.moves.frozen.borrow().contains_key(&key);
            if fresh {
                tracing::info!(topic = %key.0, partition = key.2, id = handover.id, "the partition's handover is under way: frozen for it");
                self.moves
                    .frozen
                    .borrow_mut()
                    .insert(key.clone(), (handover.id.clone(), now));
                if let Some(OwnerSlot::Ready(owner)) = self.owners.slots.borrow().get(&key) {
                    owner.mark_frozen();
                }
            }
        }
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
                self.tend_moves_as_leader().await;
            }
            self.env.runtime.sleep(MOVE_POLL_INTERVAL).await;
        }
    }

    /// On the metastore leader's first shard: a move whose destination has
    /// been dead for `cluster.move_promote_after_ms` is abandoned (the
    /// source keeps the partition; nothing else would end it, and it holds
    /// one of `cluster.max_concurrent_moves`);
    /// a node being decommissioned that still owns partitions and has no
    /// move running off it (one was abandoned: a restart during its freeze,
    /// a destination that died) gets its remaining partitions planned
    /// again, so a decommission ends without the operator asking twice.
    async fn tend_moves_as_leader(&self) {
        if self.shard_index() != 0 || !self.env.meta.is_leader() {
            return;
        }
        let stranded: Vec<String> = self
            .view()
            .state
            .moves
            .values()
            .filter(|m| m.state.is_active() && m.to != self.me())
            .filter(|m| self.dead_long_enough(m, m.to))
            .map(|m| m.id.clone())
            .collect();
        for id in stranded {
            tracing::warn!(id, "abandoning a move: its destination is dead");
            let end = Command::EndMove {
                id,
                end: MoveEnd::Abandoned {
                    reason: "the destination node is dead".to_string(),
                },
                now_ms: self.wall(),
            };
            if let Err(error) = self.env.meta.propose(end).await {
                tracing::debug!(%error, "a move to a dead node was not abandoned yet");
            }
        }
        let now = self.mono();
        if now.saturating_sub(self.moves.replanned_at.get()) < DECOMMISSION_REPLAN_INTERVAL_MS {
            return;
        }
        let view = self.view();
        let unfinished: Vec<NodeId> = view
            .state
            .nodes
            .iter()
            .filter(|(id, record)| {
                record.decommissioning
                    && view.state.partitions_of(**id) > 0
                    && !view
                        .state
                        .moves
                        .values()
                        .any(|m| m.from == **id && m.state.is_active())
            })
            .map(|(id, _)| *id)
            .collect();
        for node in unfinished {
            self.moves.replanned_at.set(now);
            match self.decommission(node).await {
                Ok(planned) if !planned.is_empty() => tracing::info!(
                    node,
                    moves = planned.len(),
                    "the decommission goes on: its remaining partitions are planned again"
                ),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(node, %error, "the decommission could not go on yet")
                }
            }
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
        for mut planned in mine {
            if planned.state == MoveState::Planned {
                let start = Command::StartMove {
                    id: planned.id.clone(),
                    max_running: u32::try_from(self.settings.cluster.max_concurrent_moves)
                        .unwrap_or(u32::MAX),
                    now_ms: self.wall(),
                };
                match self.env.meta.propose(start).await {
                    Ok(Applied::MoveChanged(m)) if m.state == MoveState::Copying => planned = m,
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
        let key = (
            planned.topic.clone(),
            planned.incarnation,
            planned.partition,
        );
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
        self.moves.installing.borrow_mut().remove(&key);
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
            now_ms: self.wall(),
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

    /// Completes once the move's source has been dead long enough for a
    /// promotion: a call to it or a backoff is not waited out past that.
    /// A source that answers within [`MOVE_PROMOTION_CHECK`] is never
    /// promoted over: the first look comes after that long.
    async fn promotion_comes_due(&self, planned: &Move) {
        loop {
            self.env.runtime.sleep(MOVE_PROMOTION_CHECK).await;
            if self.promotion_due(planned) {
                return;
            }
        }
    }

    /// Whether the move's source has been dead for
    /// `cluster.move_promote_after_ms` (counted from the move's start at
    /// the earliest): the destination's copy takes over.
    fn promotion_due(&self, planned: &Move) -> bool {
        self.dead_long_enough(planned, planned.from)
    }

    /// Whether `node`, an end of the move, is marked dead and has been dead
    /// (since the move started) for `cluster.move_promote_after_ms`: a node
    /// the controller marks dead for a moment under load is waited for.
    fn dead_long_enough(&self, planned: &Move, node: NodeId) -> bool {
        self.dead_end_at(planned, node)
            .is_some_and(|at| self.wall() >= at)
    }

    /// When `node`, an end of the move that is marked dead, will have been
    /// dead for `cluster.move_promote_after_ms`, counted from its death
    /// (the controller records a dead node's last heartbeat as the time its
    /// state changed, not the moment it noticed) or from the move's start,
    /// whichever is later. `None` while it is alive.
    fn dead_end_at(&self, planned: &Move, node: NodeId) -> Option<u64> {
        let view = self.view();
        let record = view.state.nodes.get(&node).filter(|r| !r.alive)?;
        let started = planned.started_at_ms.unwrap_or(planned.planned_at_ms);
        Some(
            record
                .since_ms
                .max(started)
                .saturating_add(self.settings.cluster.move_promote_after_ms),
        )
    }

    /// Asks the source, trying again (with backoff) while it does not
    /// answer, for as long as the move stays this shard's to run, or until
    /// the source has been dead long enough for a promotion.
    async fn ask_patiently(
        &self,
        planned: &Move,
        action: MoveAction,
    ) -> Result<SourceState, Stalled> {
        let mut backoff = MOVE_RETRY_BACKOFF_MIN;
        loop {
            // Dropping the call when the promotion comes due is safe: the
            // source is dead, and the answer would change nothing here.
            let asked = futures_lite::future::or(
                async { Some(self.ask_source(planned, action.clone()).await) },
                async {
                    self.promotion_comes_due(planned).await;
                    None
                },
            )
            .await;
            let Some(answer) = asked else {
                return Err(Stalled::SourceGone);
            };
            match answer {
                Ok(state) => return Ok(state),
                Err(error) if error.code.retry() && !self.is_stopping() => {
                    let still_running = self
                        .view()
                        .state
                        .moves
                        .get(&planned.id)
                        .is_some_and(|m| m.state.is_running());
                    if !still_running {
                        return Err(Stalled::Failed(error));
                    }
                    if self.promotion_due(planned) {
                        return Err(Stalled::SourceGone);
                    }
                    tracing::debug!(id = planned.id, %error, "the move's source did not answer; trying again");
                    let due = futures_lite::future::or(
                        async {
                            self.env.runtime.sleep(backoff).await;
                            false
                        },
                        async {
                            self.promotion_comes_due(planned).await;
                            true
                        },
                    )
                    .await;
                    if due {
                        return Err(Stalled::SourceGone);
                    }
                    backoff = (backoff * 2).min(MOVE_RETRY_BACKOFF_MAX);
                }
                Err(error) => return Err(Stalled::Failed(error)),
            }
        }
    }

    async fn report_progress(&self, planned: &Move, copied: u64, remaining: u64, freezing: bool) {
        let elapsed_ms = self
            .wall()
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
        // The copy is written in the topic's folder: it stays until the
        // move's last write.
        let _folder = self
            .env
            .folders
            .hold(&planned.topic, planned.incarnation)
            .ok_or_else(|| ApiError::new(ErrorCode::Conflict, "the topic was deleted"))?;
        let (dir, incoming) = self.move_dirs(planned);
        let internal = |e: std::io::Error| ApiError::new(ErrorCode::Internal, e.to_string());
        self.env
            .fs
            .remove_dir_all(&incoming)
            .await
            .map_err(internal)?;
        self.env
            .fs
            .create_dir_all(&incoming)
            .await
            .map_err(internal)?;
        let mut run = MoveRun {
            planned: planned.clone(),
            dir,
            incoming,
            copy: MoveCopy::new(self.settings.cluster.move_bytes_per_s, self.mono()),
            verified: VerifiedCopy::default(),
        };
        match self.copy_and_hand_over(&topic, &mut run).await {
            Ok(()) => Ok(()),
            Err(Stalled::Failed(error)) => Err(error),
            Err(Stalled::SourceGone) => self.promote(&topic, &mut run).await,
        }
    }

    /// Runs the copy's state machine (`move_copy.rs`) against the source
    /// and the disk until the copy holds all a frozen source holds, then
    /// installs it and hands over.
    async fn copy_and_hand_over(&self, topic: &Topic, run: &mut MoveRun) -> Result<(), Stalled> {
        let fs = &self.env.fs;
        let mut froze_at = self.mono();
        loop {
            match run.copy.next(self.mono()) {
                Step::Ask(action) => {
                    let freeze = action == MoveAction::Freeze;
                    let answer = self.ask_patiently(&run.planned, action).await?;
                    while freeze && self.env.faults.is_raised(Fault::HoldMoveFreeze) {
                        self.env.runtime.sleep(MOVE_HOLD_POLL).await;
                    }
                    run.copy.answered(answer);
                }
                Step::Write { name, pos, bytes } => {
                    write_copied(fs, &run.incoming, &name, pos, &bytes)
                        .await
                        .map_err(|e| Stalled::Failed(from_storage(&e)))?;
                    let written = run.copy.written();
                    metrics::counter!(MOVE_COPIED_BYTES_TOTAL).increment(written);
                }
                Step::Forget(name) => {
                    let _ = fs.remove_file(&run.incoming.join(name)).await;
                }
                Step::Report {
                    copied,
                    remaining,
                    freezing,
                } => {
                    self.report_progress(&run.planned, copied, remaining, freezing)
                        .await;
                    if freezing {
                        froze_at = self.mono();
                    }
                }
                Step::Throttle(wait) => self.env.runtime.sleep(wait).await,
                // What is copied so far is synced and checked before the
                // freeze: the freeze syncs and checks only what it copies.
                Step::Sync => {
                    self.sync_and_verify(run).await?;
                    run.copy.synced();
                }
                Step::Install => break,
            }
        }
        let copied_at = self.mono();
        let owner = self.install(topic, run, true).await?;
        let installed_at = self.mono();
        if owner.high_watermark() != run.copy.latest().high_watermark {
            return Err(Stalled::Failed(ApiError::new(
                ErrorCode::Internal,
                format!(
                    "the copy ends at offset {}, the source at {}",
                    owner.high_watermark(),
                    run.copy.latest().high_watermark
                ),
            )));
        }
        // Once applied here, its messages are announced (see
        // `wake_polls_on_handovers`).
        self.hand_over(&run.planned, MoveEnd::Done).await?;
        let freeze_ms = self.mono().saturating_sub(froze_at);
        metrics::histogram!(crate::metric_names::MOVE_FREEZE_SECONDS)
            .record(freeze_ms as f64 / 1000.0);
        tracing::info!(
            id = run.planned.id,
            freeze_ms,
            copy_ms = copied_at.saturating_sub(froze_at),
            install_ms = installed_at.saturating_sub(copied_at),
            hand_over_ms = self.mono().saturating_sub(installed_at),
            bytes = run.copy.progress().copied_bytes(),
            "partition handed over"
        );
        Ok(())
    }

    /// Syncs the segment files written since the last sync, then reads
    /// back and checks what was synced.
    async fn sync_and_verify(&self, run: &mut MoveRun) -> Result<(), Stalled> {
        let failed = |e: StorageError| Stalled::Failed(from_storage(&e));
        let dirty = run.copy.take_dirty();
        sync_copied(
            &self.env.fs,
            &run.incoming,
            dirty.iter().map(String::as_str),
        )
        .await
        .map_err(failed)?;
        run.verified
            .verify(&self.env.fs, &run.incoming, run.copy.progress())
            .await
            .map_err(failed)
    }

    /// The source has been dead for `cluster.move_promote_after_ms`: what
    /// the copy holds takes over, with the acks and cursors the source last
    /// answered. What the source committed after the copy's last read is
    /// not here; if the source returns, it quarantines it.
    async fn promote(&self, topic: &Topic, run: &mut MoveRun) -> Result<(), ApiError> {
        tracing::warn!(
            id = run.planned.id, topic = %topic.name, partition = run.planned.partition,
            source = run.planned.from,
            "the move's source has been dead for cluster.move_promote_after_ms: promoting the copy"
        );
        let owner = self.install(topic, run, false).await.map_err(|e| match e {
            Stalled::Failed(error) => error,
            Stalled::SourceGone => ApiError::new(ErrorCode::Internal, "the source is gone"),
        })?;
        let offset = owner.high_watermark();
        // The source's acks reach past what the copy holds: new messages
        // get those offsets here, and must not read as acked.
        owner
            .cut_acks_at(offset)
            .await
            .map_err(|e| from_owner(&e))?;
        self.hand_over(&run.planned, MoveEnd::Promoted { offset })
            .await
            .map_err(|e| match e {
                Stalled::Failed(error) => error,
                Stalled::SourceGone => ApiError::new(ErrorCode::Internal, "the source is gone"),
            })?;
        tracing::warn!(
            id = run.planned.id,
            offset,
            "move promoted: the copy owns the partition"
        );
        Ok(())
    }

    /// Makes the copy the partition's folder here and opens it: the segments
    /// synced, the ack set and the children's cursors the source last
    /// answered written (`exact`: the handover's, which must be there), the
    /// source's recent ids remembered.
    async fn install(
        &self,
        topic: &Topic,
        run: &mut MoveRun,
        exact: bool,
    ) -> Result<Owner<F>, Stalled> {
        let fs = &self.env.fs;
        let failed = |e: StorageError| Stalled::Failed(from_storage(&e));
        let started = self.mono();
        self.sync_and_verify(run).await?;
        // A copy whose source died mid-read ends inside a batch: it is
        // promoted at the end of its last whole batch.
        run.verified
            .cut_partial_batches(fs, &run.incoming, run.copy.progress())
            .await
            .map_err(failed)?;
        let synced_at = self.mono();
        let latest = run.copy.latest();
        let acks = match AckSet::decode(&latest.acks) {
            Some(acks) => acks,
            None if exact => {
                return Err(Stalled::Failed(ApiError::new(
                    ErrorCode::Internal,
                    "the source's ack set arrived damaged",
                )))
            }
            // Never heard: every message it holds is delivered again.
            None => AckSet::new(0),
        };
        write_initial(fs, &run.incoming.join("consumer"), &acks)
            .await
            .map_err(failed)?;
        let children = run.incoming.join("children");
        for (child, incarnation, position) in &latest.cursors {
            Cursor::create(
                fs,
                &children,
                &format!("{child}-{incarnation}.cursor"),
                *position,
            )
            .await
            .map_err(failed)?;
        }
        let internal =
            |e: std::io::Error| Stalled::Failed(ApiError::new(ErrorCode::Internal, e.to_string()));
        fs.remove_dir_all(&run.dir).await.map_err(internal)?;
        fs.rename(&run.incoming, &run.dir).await.map_err(internal)?;
        if let Some(parent) = run.dir.parent() {
            fs.sync_dir(parent).await.map_err(internal)?;
        }
        let key = (topic.name.clone(), topic.incarnation, run.planned.partition);
        self.moves.installing.borrow_mut().insert(key.clone());
        let placed_at = self.mono();
        self.moves
            .verified
            .borrow_mut()
            .insert(key.clone(), std::mem::take(&mut run.verified));
        let opened = self.owner(topic, run.planned.partition).await;
        self.moves.verified.borrow_mut().remove(&key);
        let owner = opened?;
        owner.remember_recent(&run.copy.latest().recent);
        tracing::info!(
            id = run.planned.id,
            sync_ms = synced_at.saturating_sub(started),
            state_ms = placed_at.saturating_sub(synced_at),
            open_ms = self.mono().saturating_sub(placed_at),
            "a move's copy installed"
        );
        Ok(owner)
    }

    /// Proposes how the move ends until the metastore says how it ended:
    /// `Ok` once it ended as proposed; else the copy goes.
    async fn hand_over(&self, planned: &Move, end: MoveEnd) -> Result<(), Stalled> {
        let wanted = match end {
            MoveEnd::Done => MoveState::Done,
            MoveEnd::Promoted { .. } => MoveState::Promoted,
            MoveEnd::Abandoned { .. } => MoveState::Abandoned,
        };
        loop {
            let command = Command::EndMove {
                id: planned.id.clone(),
                end: end.clone(),
                now_ms: self.wall(),
            };
            match self.env.meta.propose(command).await {
                Ok(_) => return Ok(()),
                Err(narad_raft::node::MetaError::Refused(refused)) => {
                    let ended_so = self
                        .view()
                        .state
                        .moves
                        .get(&planned.id)
                        .is_some_and(|m| m.state == wanted);
                    if ended_so {
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
                    return Err(Stalled::Failed(from_meta(
                        &narad_raft::node::MetaError::Refused(refused),
                    )));
                }
                // Unknown outcome: ask again (a second end is refused and
                // the state says which happened).
                Err(error) => {
                    tracing::warn!(id = planned.id, %error, "the move's end is unknown; asking again");
                    self.env.runtime.sleep(MOVE_RETRY_BACKOFF_MIN).await;
                }
            }
        }
    }

    /// Removes the folders of partitions this shard handed over. A promoted
    /// move's source that holds more than the copy had quarantines its
    /// folder (`quarantine/` in the data folder) and never serves it.
    async fn reap_moved_away(&self) {
        let view = self.view();
        let shards = usize::from(self.identity.shards);
        // The copy of a move that ended while this node was away (its
        // destination): nothing will use it.
        for ended in view.state.moves.values().filter(|m| {
            m.to == self.me()
                && !m.state.is_active()
                && !self.moves.running.borrow().contains(&m.id)
                && crate::mesh::shard_for(&m.topic, m.partition, shards) == self.shard_index()
        }) {
            let moving_again = view.state.moves.values().any(|m| {
                m.state.is_active()
                    && m.to == self.me()
                    && m.topic == ended.topic
                    && m.incarnation == ended.incarnation
                    && m.partition == ended.partition
            });
            let incoming = self.move_dirs(ended).1;
            if moving_again || !self.env.fs.exists(&incoming).await.unwrap_or(false) {
                continue;
            }
            match self.env.fs.remove_dir_all(&incoming).await {
                Ok(()) => {
                    tracing::info!(dir = %incoming.display(), "removed the copy of a move that ended")
                }
                Err(error) => {
                    tracing::warn!(dir = %incoming.display(), %error, "could not remove the copy of a move that ended")
                }
            }
        }
        for ended in view.state.moves.values().filter(|m| {
            m.from == self.me()
                && matches!(m.state, MoveState::Done | MoveState::Promoted)
                && crate::mesh::shard_for(&m.topic, m.partition, shards) == self.shard_index()
        }) {
            let owned_here = view.state.topics.get(&ended.topic).is_some_and(|t| {
                t.incarnation == ended.incarnation
                    && t.owners.get(ended.partition as usize) == Some(&self.me())
            });
            let dir = self.move_dirs(ended).0;
            if owned_here || !self.env.fs.exists(&dir).await.unwrap_or(false) {
                continue;
            }
            let key = (ended.topic.clone(), ended.incarnation, ended.partition);
            self.owners.slots.borrow_mut().remove(&key);
            if let Some(offset) = ended.promoted_at_offset {
                match self.holds_past(&dir, offset).await {
                    Ok(false) => {}
                    Ok(true) => {
                        self.quarantine(ended, &dir, offset).await;
                        continue;
                    }
                    Err(error) => {
                        tracing::error!(dir = %dir.display(), %error, "could not read a promoted move's old copy; it stays");
                        continue;
                    }
                }
            }
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

    /// Whether the partition log in `dir` holds offsets at or past `offset`.
    async fn holds_past(&self, dir: &Path, offset: u64) -> Result<bool, StorageError> {
        let config = LogConfig {
            segment_bytes: self.settings.storage.segment_bytes,
            prealloc_step_bytes: SEGMENT_PREALLOC_STEP_BYTES_DEFAULT
                .min(self.settings.storage.segment_bytes),
            retention_ms: 0,
        };
        let (log, _) =
            PartitionLog::open(&self.env.fs, dir, config, self.env.clock.clone()).await?;
        Ok(log.high_watermark() > offset)
    }

    async fn quarantine(&self, ended: &Move, dir: &Path, offset: u64) {
        let root = self.env.data_dir.join("quarantine");
        let to = root.join(format!(
            "{}-{}-{}-move-{}",
            ended.topic, ended.incarnation, ended.partition, ended.id
        ));
        let moved = async {
            self.env.fs.create_dir_all(&root).await?;
            self.env.fs.rename(dir, &to).await?;
            self.env.fs.sync_dir(&root).await?;
            if let Some(parent) = dir.parent() {
                self.env.fs.sync_dir(parent).await?;
            }
            Ok::<(), std::io::Error>(())
        };
        match moved.await {
            Ok(()) => {
                metrics::counter!(crate::metric_names::QUARANTINED_PARTITIONS_TOTAL).increment(1);
                tracing::error!(
                    topic = %ended.topic, partition = ended.partition, id = ended.id,
                    promoted_at = offset, folder = %to.display(),
                    "this node holds messages of a partition that was promoted elsewhere while it was away: quarantined, never served (see the docs on recovering them)"
                );
            }
            Err(error) => {
                tracing::error!(dir = %dir.display(), %error, "could not quarantine a promoted move's old copy; it stays")
            }
        }
    }

    // ------------------------------------------------------------ cluster actions

    /// `POST /v1/cluster/rebalance`: moves that even partitions over the
    /// live nodes (and off nodes being decommissioned).
    pub async fn rebalance(&self) -> Result<Vec<Move>, ApiError> {
        let plans = self.rebalance_plan();
        self.plan(plans, None).await
    }

    /// The moves `rebalance` would plan now, planning nothing (a dry run).
    pub fn rebalance_plan(&self) -> Vec<narad_raft::state::MovePlan> {
        let view = self.view();
        let nodes = self.live_nodes();
        let drain: Vec<NodeId> = view
            .state
            .nodes
            .iter()
            .filter(|(_, r)| r.decommissioning)
            .map(|(id, _)| *id)
            .collect();
        plan_balance(&view.state, &nodes, &drain, MOVES_PER_PLAN_MAX)
    }

    /// `POST /v1/cluster/nodes/{id}/decommission`: every partition of the
    /// node moves to the others; it takes no new ones.
    pub async fn decommission(&self, node: NodeId) -> Result<Vec<Move>, ApiError> {
        let plans = self.decommission_plan(node)?;
        self.plan(plans, Some(node)).await
    }

    /// The moves `decommission` would plan now, planning nothing (a dry
    /// run); the same refusals.
    pub fn decommission_plan(
        &self,
        node: NodeId,
    ) -> Result<Vec<narad_raft::state::MovePlan>, ApiError> {
        let view = self.view();
        let member = self.env.meta.members().iter().any(|(id, _)| *id == node);
        if !member && !view.state.nodes.contains_key(&node) {
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
        Ok(plan_balance(
            &view.state,
            &nodes,
            &[node],
            MOVES_PER_PLAN_MAX,
        ))
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
            now_ms: self.wall(),
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

    /// `POST /v1/cluster/moves`: moves one partition to node `to`.
    pub async fn move_partition(
        &self,
        topic: &Topic,
        partition: u32,
        to: NodeId,
    ) -> Result<Vec<Move>, ApiError> {
        if partition >= topic.config.partitions {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "partition {partition} is out of range: {:?} has {}",
                    topic.name, topic.config.partitions
                ),
            ));
        }
        let from = self.owner_node(topic, partition);
        if from == to {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "node {to} owns partition {partition} of {:?} already",
                    topic.name
                ),
            ));
        }
        let plan = narad_raft::state::MovePlan {
            topic: topic.name.clone(),
            partition,
            from,
            to,
        };
        self.plan(vec![plan], None).await
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

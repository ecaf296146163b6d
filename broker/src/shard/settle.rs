//! Settle: acks, nacks and extends by receipt, answered where the lease was
//! granted.

use super::*;
use crate::limits::SETTLE_FREEZE_WAIT;
use crate::metric_names::ACKS_TOTAL;

impl<F: FileSystem> Shard<F> {
    /// Ack, nack or extend receipts for a client. Answers in the order
    /// given; extend answers the new lease end.
    pub async fn settle(
        &self,
        topic: &Topic,
        receipts: &[String],
        action: SettleAction,
    ) -> Settled {
        let op = Settle {
            topic: TopicRef::of(topic),
            receipts: receipts.to_vec(),
            action,
        };
        self.settle_receipts(topic, op, Reach::Cluster).await
    }

    /// Settles each receipt at the node and shard that own its partition
    /// (where it was issued and is authenticated), within `reach`; a receipt
    /// of a partition beyond the reach (the sender's metadata differs) is
    /// answered 410. Answers in the order given.
    pub(super) async fn settle_receipts(&self, topic: &Topic, op: Settle, reach: Reach) -> Settled {
        let placement = self.placement(topic);
        let mut outcomes = InOrder::new(op.receipts.len());
        let groups = group_by(op.receipts, &mut outcomes, |text| {
            // A partition beyond the topic's is placed on this node: it is
            // authenticated by its shard, then answered 410.
            Receipt::peek(&text, &topic.name)
                .map(|receipt| (placement.locate(receipt.partition), text))
                .map_err(Err)
        });
        for (location, group) in groups {
            let receipts = group.items;
            let count = receipts.len();
            let to = match location {
                Location::Here => {
                    self.wait_out_freezes(topic, &receipts).await;
                    let answers = self.settle_here(topic, receipts, op.action);
                    outcomes.put_all(group.indexes, answers);
                    continue;
                }
                // Beyond the reach, the sender's metadata differs from
                // this node's: the partition moved, and its leases with it.
                _ if !location.within(reach) => {
                    outcomes.put_all(group.indexes, vec![Err(Self::lease_gone()); count]);
                    continue;
                }
                Location::Shard(shard) => Address::Shard(shard),
                Location::Node(node) => {
                    if self.is_dead(node) {
                        outcomes.put_all(group.indexes, vec![Err(Self::owner_dead(node)); count]);
                        continue;
                    }
                    Address::Node(node)
                }
            };
            let timeout = matches!(to, Address::Node(_)).then_some(SETTLE_CALL_TIMEOUT);
            let part = Settle {
                topic: op.topic.clone(),
                receipts,
                action: op.action,
            };
            let answers = match self.call(to, part, timeout).await {
                Ok(answers) => answers,
                Err(error) => vec![Err(error.to_api(to)); count],
            };
            outcomes.put_all(group.indexes, answers);
        }
        outcomes.finish(Self::receipt_unsettled)
    }

    /// Settles of a partition frozen for its handover wait for the freeze
    /// to end, for at most [`SETTLE_FREEZE_WAIT`]: then the partition serves
    /// here again (the move was abandoned) and they apply, or it moved away
    /// and they are answered 410 (the move ended their leases). Only a
    /// freeze that outlasts the wait is answered 503 `partition_moving`.
    /// Waiting changes nothing, so a settle dropped meanwhile leaves no
    /// trace.
    async fn wait_out_freezes(&self, topic: &Topic, receipts: &[String]) {
        let any_frozen = || {
            receipts.iter().any(|text| {
                Receipt::peek(text, &topic.name).is_ok_and(|r| self.is_frozen(topic, r.partition))
            })
        };
        self.wait_for_thaw(SETTLE_FREEZE_WAIT, any_frozen).await;
    }

    /// The answer of a receipt nobody answered: a bug, answered 500 rather
    /// than left out.
    pub(super) fn receipt_unsettled() -> SettleOutcome {
        Err(ApiError::new(ErrorCode::Internal, "receipt not settled"))
    }

    pub(super) fn lease_gone() -> ApiError {
        ApiError::new(
            ErrorCode::LeaseGone,
            "the lease already ended (it ran out, or the message was settled); unless it was acked, the message is or will be delivered again",
        )
    }

    /// Decodes a receipt: 400 if forged or of another topic, 410 if it comes
    /// from an earlier start of the node or names a partition that is gone.
    pub(super) fn check_receipt(&self, topic: &Topic, text: &str) -> Result<Receipt, ApiError> {
        let receipt = match Receipt::decode(text, &topic.name, &self.env.receipt_key) {
            Ok(receipt) => receipt,
            // Issued by the partition's owner before it moved here (another
            // node's key): that lease ended with the move.
            Err(error) => {
                let moved = Receipt::peek(text, &topic.name)
                    .is_ok_and(|r| self.moved_here(topic, r.partition));
                return Err(if moved { Self::lease_gone() } else { error });
            }
        };
        if receipt.owner_epoch != self.identity.incarnation
            || receipt.partition >= topic.config.partitions
        {
            return Err(Self::lease_gone());
        }
        Ok(receipt)
    }

    /// Settles receipts of partitions this shard owns, authenticating each.
    pub(super) fn settle_here(
        &self,
        topic: &Topic,
        receipts: Vec<String>,
        action: SettleAction,
    ) -> Settled {
        if self.flow.acks_closed.get() {
            let stopping = ApiError::new(ErrorCode::Stopping, "the node is stopping");
            return vec![Err(stopping); receipts.len()];
        }
        let now = self.now();
        let answers: Vec<SettleOutcome> = receipts
            .into_iter()
            .map(|text| {
                let receipt = self.check_receipt(topic, &text)?;
                if self.is_frozen(topic, receipt.partition) {
                    return Err(Self::moving_error(topic, receipt.partition));
                }
                let key = (topic.name.clone(), topic.incarnation, receipt.partition);
                let owner = match self.owners.slots.borrow().get(&key) {
                    Some(OwnerSlot::Ready(owner)) => owner.clone(),
                    _ => return Err(Self::lease_gone()),
                };
                let (offset, lease) = (receipt.offset, receipt.lease_id);
                // An ack that cannot be made durable did not land: say so
                // rather than answer 204 for an ack held in memory only.
                if let Some(reason) = owner.ack_state_failure() {
                    return Err(ApiError::new(
                        ErrorCode::AckStateFailed,
                        format!(
                            "acks of partition {} cannot be made durable on this node: {reason}",
                            receipt.partition
                        ),
                    ));
                }
                let result = match action {
                    SettleAction::Ack => owner.ack(offset, lease, now).map(|()| None),
                    SettleAction::Nack { delay_ms } => {
                        let nacked = owner.nack(offset, lease, delay_ms, now).map(|()| None);
                        if owner.has_dead_letters() {
                            self.flow.dead_letters_due.notify();
                        }
                        nacked
                    }
                    SettleAction::Extend {
                        visibility_timeout_ms,
                    } => owner
                        .extend(offset, lease, visibility_timeout_ms, now)
                        .map(Some),
                };
                result.map_err(|e| from_owner(&e))
            })
            .collect();
        match action {
            SettleAction::Ack => {
                // Counted once per answer, not per receipt: finding a
                // labelled counter costs more than the ack itself.
                let acked = answers.iter().filter(|a| a.is_ok()).count() as u64;
                let gone = answers.len() as u64 - acked;
                for (label, count) in [("acked", acked), ("lease_gone", gone)] {
                    if count > 0 {
                        metrics::counter!(ACKS_TOTAL, "result" => label).increment(count);
                    }
                }
            }
            SettleAction::Nack { .. } => {
                let nacked = answers.iter().filter(|a| a.is_ok()).count();
                if nacked > 0 {
                    self.announce_available(&topic.name, count_of(nacked));
                }
            }
            SettleAction::Extend { .. } => {}
        }
        answers
    }
}

//! Settle: acks, nacks and extends by receipt, answered where the lease was
//! granted.

use super::*;
use crate::metric_names::ACKS_TOTAL;

impl Shard {
    /// Ack, nack or extend receipts, each at the node and shard that own
    /// its partition (where it was issued and is authenticated). Answers in
    /// the order given; extend answers the new lease end.
    pub async fn settle(
        &self,
        topic: &Topic,
        receipts: &[String],
        action: SettleAction,
    ) -> Vec<SettleOutcome> {
        let mut outcomes = InOrder::new(receipts.len());
        let me = self.me();
        let groups = group_by(receipts, &mut outcomes, |text| {
            // A partition beyond the topic's is "this node's": it is
            // authenticated here, then answered 410.
            Receipt::peek(text, &topic.name)
                .map(|receipt| (self.owner_node(topic, receipt.partition), text.clone()))
                .map_err(Err)
        });
        for (node, group) in groups {
            let texts = group.items;
            let count = texts.len();
            let answers = if node == me {
                self.settle_on_node(topic, texts, action).await
            } else if self.is_dead(node) {
                vec![Err(Self::owner_dead(node)); count]
            } else {
                let request = DataRequest::Settle {
                    topic: topic.name.clone(),
                    incarnation: topic.incarnation,
                    receipts: texts,
                    action: action.into(),
                };
                match self.call_node(node, &request, SETTLE_CALL_TIMEOUT).await {
                    Ok(DataAnswer::Settled(list)) if list.len() == count => list
                        .into_iter()
                        .map(|o| match o.error {
                            Some(error) => Err(error.to_api()),
                            None => Ok(o.lease_expires_at_ms),
                        })
                        .collect(),
                    Ok(_) => vec![
                        Err(ApiError::new(
                            ErrorCode::Internal,
                            format!("node {node} answered a settle oddly"),
                        ));
                        count
                    ],
                    Err(error) => vec![Err(error.to_api(node)); count],
                }
            };
            outcomes.put_all(group.indexes, answers);
        }
        outcomes.finish(Self::receipt_unsettled)
    }

    /// Settles receipts of this node's partitions, each at the shard that
    /// owns its partition.
    pub(super) async fn settle_on_node(
        &self,
        topic: &Topic,
        receipts: Vec<String>,
        action: SettleAction,
    ) -> Vec<SettleOutcome> {
        let mut outcomes = InOrder::new(receipts.len());
        let groups = group_by(receipts, &mut outcomes, |text| {
            self.check_receipt(topic, &text)
                .map(|receipt| (self.mesh.owner_of(&topic.name, receipt.partition), receipt))
                .map_err(Err)
        });
        for (shard, group) in groups {
            let receipts = group.items;
            let answers = if shard == self.mesh.me() {
                self.settle_local(topic, receipts, action)
            } else {
                let count = receipts.len();
                let topic = topic.clone();
                match self
                    .mesh
                    .call(shard, None, |reply| ShardMsg::Settle {
                        topic,
                        receipts,
                        action,
                        reply,
                    })
                    .await
                {
                    Ok(answers) => answers,
                    Err(error) => vec![Err(error); count],
                }
            };
            outcomes.put_all(group.indexes, answers);
        }
        outcomes.finish(Self::receipt_unsettled)
    }

    /// The answer of a receipt nobody answered: a bug, answered 500 rather
    /// than left out.
    pub(super) fn receipt_unsettled() -> SettleOutcome {
        Err(ApiError::new(ErrorCode::Internal, "receipt not settled"))
    }

    pub(super) fn lease_gone() -> ApiError {
        ApiError::new(
            ErrorCode::LeaseGone,
            "the lease already ended; the message is or will be delivered again",
        )
    }

    /// Decodes a receipt: 400 if forged or of another topic, 410 if it comes
    /// from an earlier start of the node or names a partition that is gone.
    pub(super) fn check_receipt(&self, topic: &Topic, text: &str) -> Result<Receipt, ApiError> {
        let receipt = Receipt::decode(text, &topic.name, &self.env.receipt_key)?;
        if receipt.owner_epoch != self.identity.incarnation
            || receipt.partition >= topic.config.partitions
        {
            return Err(Self::lease_gone());
        }
        Ok(receipt)
    }

    /// Settles receipts of partitions this shard owns.
    pub(super) fn settle_local(
        &self,
        topic: &Topic,
        receipts: Vec<Receipt>,
        action: SettleAction,
    ) -> Vec<SettleOutcome> {
        if self.flow.acks_closed.get() {
            let stopping = ApiError::new(ErrorCode::Stopping, "the node is stopping");
            return vec![Err(stopping); receipts.len()];
        }
        let now = self.now();
        let answers: Vec<SettleOutcome> = receipts
            .into_iter()
            .map(|receipt| {
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
                for answer in &answers {
                    let label = if answer.is_ok() {
                        "acked"
                    } else {
                        "lease_gone"
                    };
                    metrics::counter!(ACKS_TOTAL, "result" => label).increment(1);
                }
            }
            SettleAction::Nack { .. } => self.announce_available(),
            SettleAction::Extend { .. } => {}
        }
        answers
    }
}

//! Writes at the leader: a command proposed here or forwarded from
//! another member, and membership changes (admitting learners, making
//! them voters, removing members).

use super::*;

/// Writes at this node if it leads; else sends the command to the leader
/// once it is known.
pub(super) async fn propose_at_leader(
    raft: Raft<TypeConfig>,
    caller: Option<Arc<dyn PeerCaller>>,
    command: Command,
    node_id: NodeId,
    submitted: &std::sync::atomic::AtomicBool,
    leaving: &std::sync::atomic::AtomicBool,
    contact: &LeaderContact,
) -> Result<Applied, MetaError> {
    loop {
        // A follower that has not heard its leader for a while is cut off
        // from it (it calls no election, see `prevote`): it has no leader
        // to forward to, and waits for one as if none were known.
        let unheard_leader = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            metrics
                .current_leader
                .is_some_and(|leader| leader != node_id)
                && !leader_heard(contact)
        };
        if unheard_leader {
            let _ = raft
                .wait(Some(FORWARD_RETRY_WAIT))
                .metrics(|m| m.current_leader == Some(node_id), "leadership")
                .await;
            continue;
        }
        // A leader handing over appends nothing more: an entry its
        // successor lacks would cost the successor this node's vote. The
        // write waits for the next leader instead.
        let handing_over = leaving.load(std::sync::atomic::Ordering::SeqCst)
            && raft.metrics().borrow().current_leader == Some(node_id);
        if handing_over {
            let _ = raft
                .wait(Some(FORWARD_RETRY_WAIT))
                .metrics(|m| m.current_leader != Some(node_id), "another leader")
                .await;
            continue;
        }
        // A leader cut off from its quorum refuses at once instead of
        // appending a change that might commit much later.
        let stale_leader = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            metrics.current_leader == Some(node_id)
                && !quorum_fresh(metrics.millis_since_quorum_ack)
                && metrics.membership_config.membership().voter_ids().count() > 1
        };
        if stale_leader {
            // A new leader hears from its quorum within a heartbeat or two.
            let heard = raft
                .wait(Some(QUORUM_ACK_WAIT))
                .metrics(
                    |m| {
                        m.current_leader != Some(node_id) || quorum_fresh(m.millis_since_quorum_ack)
                    },
                    "a quorum acknowledgement",
                )
                .await;
            if heard.is_err() {
                return Err(MetaError::NoQuorum(
                    "this node leads but has not heard from a quorum".into(),
                ));
            }
            continue;
        }
        submitted.store(true, std::sync::atomic::Ordering::SeqCst);
        let forward = match raft.client_write(command.clone()).await {
            Ok(response) => return Ok(response.data?),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => forward,
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                return Err(MetaError::Failed(e.to_string()))
            }
            Err(RaftError::Fatal(fatal)) => return Err(MetaError::Failed(fatal.to_string())),
        };
        match (forward.leader_node, &caller) {
            (Some(leader), Some(caller)) => {
                let payload =
                    serde_json::to_vec(&command).map_err(|e| MetaError::Failed(e.to_string()))?;
                match caller
                    .call(&leader.addr, KIND_FORWARD_WRITE, payload, FORWARD_TIMEOUT)
                    .await
                {
                    Ok(answer) => {
                        return serde_json::from_slice::<Result<Applied, MetaError>>(&answer)
                            .map_err(|e| MetaError::Failed(format!("the leader's answer: {e}")))?
                    }
                    // The leader may have just stopped: try whoever leads
                    // next (the caller's timeout bounds the retries).
                    Err(error) => {
                        tracing::debug!(%error, "a forwarded write got no answer; trying again");
                        let tried = forward.leader_id;
                        let _ = raft
                            .wait(Some(FORWARD_RETRY_WAIT))
                            .metrics(|m| m.current_leader != tried, "another leader")
                            .await;
                    }
                }
            }
            // No leader yet: wait for one (the caller's timeout bounds this).
            _ => {
                submitted.store(false, std::sync::atomic::Ordering::SeqCst);
                let _ = raft
                    .wait(Some(Duration::from_millis(500)))
                    .metrics(|m| m.current_leader.is_some(), "a leader")
                    .await;
            }
        }
    }
}

/// Makes a membership change on the leader: this node if it leads, else
/// the leader it knows of (retried while leadership moves).
pub(super) async fn change_members_at_leader(
    raft: Raft<TypeConfig>,
    caller: Option<Arc<dyn PeerCaller>>,
    change: MemberChange,
) -> Result<Applied, MetaError> {
    loop {
        let (leader, leader_addr, me) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            let addr = metrics.current_leader.and_then(|l| {
                metrics
                    .membership_config
                    .membership()
                    .get_node(&l)
                    .map(|n| n.addr.clone())
            });
            (metrics.current_leader, addr, metrics.id)
        };
        match leader {
            Some(leader) if leader == me => return change_members_here(&raft, &change).await,
            Some(_) => {
                let (Some(addr), Some(caller)) = (leader_addr, &caller) else {
                    return Err(MetaError::NoQuorum(
                        "the leader's address is unknown".into(),
                    ));
                };
                let payload =
                    serde_json::to_vec(&change).map_err(|e| MetaError::Failed(e.to_string()))?;
                match caller
                    .call(&addr, KIND_MEMBER_CHANGE, payload, MEMBER_CHANGE_TIMEOUT)
                    .await
                {
                    Ok(answer) => {
                        return serde_json::from_slice::<Result<Applied, MetaError>>(&answer)
                            .map_err(|e| MetaError::Failed(format!("the leader's answer: {e}")))?
                    }
                    Err(error) => {
                        tracing::debug!(%error, "a membership change got no answer; trying again");
                        let _ = raft
                            .wait(Some(FORWARD_RETRY_WAIT))
                            .metrics(|m| m.current_leader != leader, "another leader")
                            .await;
                    }
                }
            }
            None => {
                let _ = raft
                    .wait(Some(FORWARD_RETRY_WAIT))
                    .metrics(|m| m.current_leader.is_some(), "a leader")
                    .await;
            }
        }
    }
}

/// A membership change on this node, the leader.
pub(super) async fn change_members_here(
    raft: &Raft<TypeConfig>,
    change: &MemberChange,
) -> Result<Applied, MetaError> {
    let failed = |e: &dyn std::fmt::Display| MetaError::NoQuorum(e.to_string());
    let write = |command: Command| async move {
        match raft.client_write(command).await {
            Ok(response) => response.data.map_err(MetaError::from),
            Err(error) => Err(failed(&error)),
        }
    };
    match change {
        MemberChange::Admit { id, addr } => {
            let known = raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(id)
                .map(|n| n.addr.clone());
            match known {
                Some(known) if known != *addr => {
                    return Err(MetaError::Refused(Refused::MemberAddressTaken {
                        id: *id,
                        addr: known,
                    }))
                }
                Some(_) => {}
                None => {
                    raft.add_learner(*id, BasicNode { addr: addr.clone() }, false)
                        .await
                        .map_err(|e| failed(&e))?;
                    tracing::info!(node = id, %addr, "admitted a node as a learner");
                }
            }
            write(Command::AdmitNode {
                id: *id,
                addr: addr.clone(),
                now_ms: wall_ms(),
            })
            .await
        }
        MemberChange::Remove { id } => {
            let member = raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(id)
                .is_some();
            let applied = write(Command::RemoveNode { id: *id, member }).await?;
            let (voter, member) = {
                let metrics = raft.metrics();
                let metrics = metrics.borrow();
                let membership = metrics.membership_config.membership();
                (
                    membership.voter_ids().any(|v| v == *id),
                    membership.get_node(id).is_some(),
                )
            };
            let ids = BTreeSet::from([*id]);
            if voter {
                raft.change_membership(ChangeMembers::RemoveVoters(ids), false)
                    .await
                    .map_err(|e| failed(&e))?;
            } else if member {
                raft.change_membership(ChangeMembers::RemoveNodes(ids), false)
                    .await
                    .map_err(|e| failed(&e))?;
            }
            tracing::info!(node = id, "removed a node from the cluster");
            Ok(applied)
        }
    }
}

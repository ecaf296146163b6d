//! Answering other members: Raft RPCs, forwarded writes, probes,
//! heartbeats, elections and membership changes.

use super::*;

impl MetaNode {
    /// Answers a request from another node (see the `KIND_` constants).
    pub fn serve(&self, kind: u8, payload: Vec<u8>) -> BoxFuture<Result<Vec<u8>, String>> {
        let raft = self.raft.clone();
        let caller = self.caller.clone();
        let heard = self.heard.clone();
        let refuse_votes_up_to = self.refuse_votes_up_to;
        let leaving = self.leaving.clone();
        let (contact, election_timeout_min) = (self.contact.clone(), self.election_timeout_min);
        let me = self.node_id;
        Box::pin(async move {
            let bad = |e: serde_json::Error| format!("bad request of kind {kind}: {e}");
            let answer = match kind {
                KIND_APPEND_ENTRIES => {
                    let request = serde_json::from_slice(&payload).map_err(bad)?;
                    let answer = raft.append_entries(request).await;
                    // A leader of this term or a later one (a stale one is
                    // answered with the higher vote and is no contact).
                    if !matches!(answer, Err(_) | Ok(AppendEntriesResponse::HigherVote(_))) {
                        contact.heard();
                    }
                    serde_json::to_vec(&answer)
                }
                KIND_PRE_VOTE => {
                    let leads_with_quorum = {
                        let metrics = raft.metrics();
                        let metrics = metrics.borrow();
                        metrics.current_leader == Some(me)
                            && quorum_fresh(metrics.millis_since_quorum_ack)
                    };
                    serde_json::to_vec(&PreVoteAnswer {
                        granted: prevote::grants(
                            leads_with_quorum,
                            contact.fresh(election_timeout_min),
                        ),
                    })
                }
                KIND_VOTE => {
                    let request: VoteRequest<NodeId> =
                        serde_json::from_slice(&payload).map_err(bad)?;
                    if request.vote.leader_id().term <= refuse_votes_up_to {
                        // Not granted, and nothing recorded: see `boot`.
                        let refused: Result<VoteResponse<NodeId>, RaftError<NodeId>> =
                            Ok(VoteResponse::new(request.vote, None, false));
                        serde_json::to_vec(&refused)
                    } else {
                        serde_json::to_vec(&raft.vote(request).await)
                    }
                }
                KIND_HEARTBEAT => {
                    let beat: Heartbeat = serde_json::from_slice(&payload).map_err(bad)?;
                    if let Ok(mut heard) = heard.lock() {
                        heard.insert(beat.id, (std::time::Instant::now(), beat.addr));
                    }
                    Ok(Vec::new())
                }
                KIND_ELECT => {
                    raft.trigger().elect().await.map_err(|e| e.to_string())?;
                    Ok(Vec::new())
                }
                KIND_PROBE => {
                    let metrics = raft.metrics().borrow().clone();
                    let initialized = metrics
                        .membership_config
                        .membership()
                        .voter_ids()
                        .next()
                        .is_some();
                    serde_json::to_vec(&ProbeAnswer {
                        initialized,
                        term: metrics.current_term,
                        applied: metrics.last_applied.map_or(0, |l| l.index),
                    })
                }
                KIND_INSTALL_SNAPSHOT => {
                    let request: InstallSnapshotRequest<TypeConfig> =
                        serde_json::from_slice(&payload).map_err(bad)?;
                    let sender = request.vote;
                    let answer = raft.install_snapshot(request).await;
                    // A deposed leader is answered with the higher vote.
                    if answer.as_ref().is_ok_and(|a| a.vote <= sender) {
                        contact.heard();
                    }
                    serde_json::to_vec(&answer)
                }
                KIND_FORWARD_WRITE => {
                    if leaving.load(std::sync::atomic::Ordering::SeqCst) {
                        // The sender tries whoever leads next.
                        return Err("handing leadership over".to_string());
                    }
                    let command: Command = serde_json::from_slice(&payload).map_err(bad)?;
                    // Only the leader takes forwarded writes: no second hop.
                    let result = match raft.client_write(command).await {
                        Ok(response) => response.data.map_err(MetaError::from),
                        Err(error) => Err(MetaError::NoQuorum(format!(
                            "the node forwarded to could not take the write: {error}"
                        ))),
                    };
                    serde_json::to_vec(&result)
                }
                KIND_MEMBER_CHANGE => {
                    let change: MemberChange = serde_json::from_slice(&payload).map_err(bad)?;
                    let result = tokio::time::timeout(
                        MEMBER_CHANGE_TIMEOUT,
                        change_members_at_leader(raft, caller, change),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(MetaError::NoQuorum(
                            "the membership change took too long".into(),
                        ))
                    });
                    serde_json::to_vec(&result)
                }
                other => return Err(format!("no metastore request of kind {other}")),
            };
            answer.map_err(|e| e.to_string())
        })
    }
}

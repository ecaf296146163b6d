//! openraft's network adapter: Raft RPCs to other members through the
//! node's [`PeerCaller`], as requests of the kinds in [`super`].

use super::*;

/// The peer network as openraft sees it.
#[derive(Clone, Default)]
pub struct PeerNetwork {
    pub(super) caller: Option<Arc<dyn PeerCaller>>,
}

/// One target of the peer network.
pub struct PeerClient {
    caller: Option<Arc<dyn PeerCaller>>,
    target: NodeId,
    addr: String,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;
    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient {
            caller: self.caller.clone(),
            target,
            addr: node.addr.clone(),
        }
    }
}

pub(super) fn unreachable<E: std::error::Error>(why: &str) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(why.to_string())))
}

impl PeerClient {
    /// Sends one RPC; the peer answers the serialized result of the same
    /// call on its own Raft.
    async fn rpc<Req, Resp, E>(
        &self,
        kind: u8,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: serde::Serialize,
        Resp: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let Some(caller) = &self.caller else {
            return Err(unreachable("no peer network"));
        };
        let payload = serde_json::to_vec(request).map_err(|e| unreachable(&e.to_string()))?;
        let answer = caller
            .call(&self.addr, kind, payload, option.hard_ttl())
            .await
            .map_err(|e| unreachable(&e))?;
        let result: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&answer).map_err(|e| unreachable(&e.to_string()))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.rpc(KIND_APPEND_ENTRIES, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.rpc(KIND_INSTALL_SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.rpc(KIND_VOTE, &rpc, &option).await
    }
}

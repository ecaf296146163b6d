//! The replicated state machine. `apply` must be deterministic: every node
//! applies the same commands in the same order and reaches the same state,
//! so it reads no clock and no randomness (the proposer puts times in the
//! command).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::moves::{Move, MoveEnd, MovePlan, MoveState};

pub type NodeId = u64;

/// A topic's settings (the body of PUT /v1/topics/{topic}, resolved).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    pub partitions: u32,
    pub visibility_timeout_ms: u64,
    pub retention_ms: u64,
    pub max_deliveries: u32,
    pub dead_letter_topic: Option<String>,
    pub schema: Option<String>,
    pub max_message_bytes: u64,
    /// How long a produce's idempotency key holds (0: keys are ignored).
    /// Topics created by an earlier release read as the default window.
    #[serde(default = "default_idempotency_window_ms")]
    pub idempotency_window_ms: u64,
}

/// The window `topics.default_idempotency_window_ms` starts with: 5 minutes.
pub const IDEMPOTENCY_WINDOW_MS_DEFAULT: u64 = 300_000;

fn default_idempotency_window_ms() -> u64 {
    IDEMPOTENCY_WINDOW_MS_DEFAULT
}

/// A topic as the metastore holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    pub name: String,
    pub config: TopicConfig,
    /// Owner node of each partition, by index.
    pub owners: Vec<NodeId>,
    /// Distinguishes a topic from an earlier one of the same name: a topic
    /// created again starts empty, in new partition directories.
    pub incarnation: u64,
    pub created_at_ms: u64,
    /// Its children by name: topics that get a copy of every message
    /// written here after they were created.
    #[serde(default)]
    pub children: BTreeMap<String, Child>,
    /// The topic this one is a child of.
    #[serde(default)]
    pub parent: Option<String>,
}

/// How a child copies its parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ChildKind {
    /// As fast as the child's owners take commits.
    Fanout,
    /// Each copy no earlier than `delay_ms` after the parent accepted it.
    Delay { delay_ms: u64 },
    /// Each partition on another node than the parent partition it copies.
    Replica,
    /// A topic of another Narad cluster, sent to its batch produce API (no
    /// local child topic).
    Remote { remote: Box<RemoteTarget> },
}

impl ChildKind {
    pub fn name(&self) -> &'static str {
        match self {
            ChildKind::Fanout => "fanout",
            ChildKind::Delay { .. } => "delay",
            ChildKind::Replica => "replica",
            ChildKind::Remote { .. } => "remote",
        }
    }

    /// Whether the child is a topic of this cluster.
    pub fn is_local(&self) -> bool {
        !matches!(self, ChildKind::Remote { .. })
    }
}

/// Where a remote child sends its copies. The token is kept as given (in
/// the metastore, so on every node's volume) and never shown: not by any
/// answer, nor by `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteTarget {
    /// `https://HOST:PORT` (or `http://` for loopback and tests).
    pub url: String,
    /// The topic on the remote cluster.
    pub topic: String,
    /// A bearer token with the produce grant there; none for a remote
    /// without auth.
    #[serde(default)]
    pub token: Option<String>,
    /// Bytes (keys and values) per second over the whole cluster; none
    /// for no limit.
    #[serde(default)]
    pub rate_bytes_per_s: Option<u64>,
}

impl std::fmt::Debug for RemoteTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTarget")
            .field("url", &self.url)
            .field("topic", &self.topic)
            .field("token", &self.token.as_ref().map(|_| "(hidden)"))
            .field("rate_bytes_per_s", &self.rate_bytes_per_s)
            .finish()
    }
}

/// A parent's record of one child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Child {
    pub kind: ChildKind,
    /// The child topic's incarnation: a child created again under the same
    /// name starts its cursors afresh.
    pub incarnation: u64,
    pub created_at_ms: u64,
}

/// A dead-letter redrive: messages of `dlq` written durably to `to`, each
/// acked in `dlq` after, run by one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redrive {
    pub dlq: String,
    pub to: String,
    /// At most this many messages a second (none: as fast as it goes).
    pub rate_per_s: Option<u64>,
    /// Stop after this many (none: until the dead-letter topic is empty).
    pub max_messages: Option<u64>,
    /// The node that runs it.
    pub node: NodeId,
    /// Moved so far, as last reported by its node.
    pub moved: u64,
    pub state: RedriveState,
    pub created_at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedriveState {
    Running,
    Done,
    Cancelled,
    Failed(String),
}

impl RedriveState {
    pub fn name(&self) -> &'static str {
        match self {
            RedriveState::Running => "running",
            RedriveState::Done => "done",
            RedriveState::Cancelled => "cancelled",
            RedriveState::Failed(_) => "failed",
        }
    }
}

/// Finished redrives a dead-letter topic keeps listed.
pub const REDRIVES_KEPT: usize = 20;
/// Redrives of one dead-letter topic that may run at once.
pub const REDRIVES_RUNNING_MAX: usize = 4;

/// A delay child's parent keeps messages at least this much longer than
/// the delay.
pub const DELAY_RETENTION_MARGIN_MS: u64 = 3_600_000;

/// Whether `retention_ms` (0 = forever) keeps messages long enough for a
/// delay of `delay_ms`.
pub fn retention_covers_delay(retention_ms: u64, delay_ms: u64) -> bool {
    retention_ms == 0 || retention_ms >= delay_ms.saturating_add(DELAY_RETENTION_MARGIN_MS)
}

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Produce,
    Consume,
    /// Topics, their children and redrives, and a topic's schema field.
    Admin,
    /// Users, grants, schemas, nodes and moves: not about one topic.
    Cluster,
}

impl Action {
    pub const ALL: [Action; 4] = [
        Action::Produce,
        Action::Consume,
        Action::Admin,
        Action::Cluster,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Produce => "produce",
            Action::Consume => "consume",
            Action::Admin => "admin",
            Action::Cluster => "cluster",
        }
    }
}

/// Actions on the topics a name or prefix pattern matches: `orders`, or
/// `billing.*` for every topic whose name starts with `billing.` (`*` alone:
/// every topic).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub topic: String,
    pub actions: Vec<Action>,
}

impl Grant {
    /// Whether the pattern covers `topic`.
    pub fn matches(&self, topic: &str) -> bool {
        match self.topic.strip_suffix('*') {
            Some(prefix) => topic.starts_with(prefix),
            None => self.topic == topic,
        }
    }
}

/// A user: never its password, only the password's argon2id hash (PHC
/// string), made by the proposer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub password_hash: String,
    pub grants: Vec<Grant>,
    pub created_at_ms: u64,
}

/// A bearer token: only the hash of its secret part is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    pub user: String,
    /// Hex BLAKE3 of the token's secret.
    pub secret_hash: String,
    pub created_at_ms: u64,
}

/// Every version of a schema: `versions[i]` is version `i + 1`, a JSON
/// Schema document as text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schema {
    pub versions: Vec<String>,
}

impl Schema {
    /// The latest version's number and document.
    pub fn latest(&self) -> (u32, &str) {
        (
            u32::try_from(self.versions.len()).unwrap_or(u32::MAX),
            self.versions.last().map_or("{}", String::as_str),
        )
    }
}

/// What a proposer asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create or update a topic; `owners` assigns the partitions a create or
    /// an increase adds (the controller chose them).
    PutTopic {
        name: String,
        config: TopicConfig,
        new_owners: Vec<NodeId>,
        now_ms: u64,
    },
    DeleteTopic {
        name: String,
    },
    /// Names the cluster once (the first leader does it).
    InitCluster {
        cluster_id: String,
    },
    /// The controller saw a node start or stop answering heartbeats.
    SetNodeState {
        id: NodeId,
        addr: String,
        alive: bool,
        now_ms: u64,
    },
    /// Where a node's Kafka listener takes clients (`None`: it has none),
    /// for Metadata answers on every node.
    SetKafkaAddress {
        id: NodeId,
        addr: Option<String>,
    },
    /// Creates a user or changes its password; with `if_absent`, only
    /// creates (the bootstrap of `admin` from every node's configuration).
    PutUser {
        name: String,
        password_hash: String,
        if_absent: bool,
        now_ms: u64,
    },
    /// Deletes a user and its tokens.
    DeleteUser {
        name: String,
    },
    SetGrants {
        user: String,
        grants: Vec<Grant>,
    },
    AddToken {
        user: String,
        id: String,
        secret_hash: String,
        now_ms: u64,
    },
    RevokeToken {
        user: String,
        id: String,
    },
    /// Adds the next version of a schema (the first creates it).
    PutSchema {
        name: String,
        document: String,
    },
    DeleteSchema {
        name: String,
    },
    /// Creates a child topic of `parent` (or changes one), starting the
    /// copy; `new_owners` places the partitions a create or an increase adds.
    PutChild {
        parent: String,
        child: String,
        kind: ChildKind,
        config: TopicConfig,
        new_owners: Vec<NodeId>,
        now_ms: u64,
    },
    /// Creates a remote child of `parent` (or changes its target): a link
    /// only, no local topic.
    PutRemoteChild {
        parent: String,
        child: String,
        remote: Box<RemoteTarget>,
        now_ms: u64,
    },
    /// Stops copying to `child`; the child topic stays.
    DeleteChild {
        parent: String,
        child: String,
    },
    /// Starts moving the messages of a dead-letter topic to `to`, run by `node`.
    StartRedrive {
        id: String,
        dlq: String,
        to: String,
        rate_per_s: Option<u64>,
        max_messages: Option<u64>,
        node: NodeId,
        now_ms: u64,
    },
    /// A running redrive's progress, and its end when `state` is given.
    RedriveProgress {
        id: String,
        moved: u64,
        state: Option<RedriveState>,
    },
    /// Plans moves (a rebalance, or a decommission of `decommission`,
    /// which also marks that node).
    PlanMoves {
        moves: Vec<MovePlan>,
        decommission: Option<NodeId>,
        now_ms: u64,
    },
    /// The destination starts a planned move, if fewer than `max_running`
    /// run (`cluster.max_concurrent_moves`).
    StartMove {
        id: String,
        max_running: u32,
        now_ms: u64,
    },
    /// How far a running move copied; `freezing`: its handover began.
    MoveProgress {
        id: String,
        copied_bytes: u64,
        total_bytes: u64,
        rate_bytes_per_s: u64,
        freezing: bool,
    },
    /// A move ends: handed over (the destination owns the partition),
    /// promoted, or abandoned.
    EndMove {
        id: String,
        end: MoveEnd,
        now_ms: u64,
    },
    /// A node asked to join, or an operator admitted it.
    AdmitNode {
        id: NodeId,
        addr: String,
        now_ms: u64,
    },
    /// Forgets a dead or decommissioned node that owns nothing, before it
    /// leaves the Raft membership.
    RemoveNode {
        id: NodeId,
        /// Whether the Raft membership holds it (the leader says): a
        /// member the controller has not judged yet is in service.
        #[serde(default)]
        member: bool,
    },
    CancelRedrive {
        dlq: String,
        id: String,
    },
}

/// What the controller knows about a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub addr: String,
    pub alive: bool,
    /// When the state last changed: for a dead node, when the controller
    /// last heard it (when it died, not when that was noticed).
    pub since_ms: u64,
    /// Its partitions are moving off it (or moved: decommissioned); it
    /// gets no new ones.
    #[serde(default)]
    pub decommissioning: bool,
}

/// What applying a command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    TopicCreated(Topic),
    TopicUpdated(Topic),
    TopicUnchanged(Topic),
    TopicDeleted,
    /// A cluster or node record changed.
    ClusterChanged,
    UserCreated,
    /// A user's password, grants or tokens changed, or it was deleted.
    UserChanged,
    /// The schema's latest version now, and whether this created it.
    SchemaPut {
        version: u32,
        created: bool,
    },
    SchemaDeleted,
    /// The child topic, as PUT left it, and whether this created it.
    ChildPut {
        topic: Topic,
        created: bool,
    },
    /// A remote child's link, as PUT left it, and whether this created it.
    RemoteChildPut {
        link: Child,
        created: bool,
    },
    ChildDeleted,
    RedriveChanged(Redrive),
    MovesPlanned(Vec<Move>),
    MoveChanged(Move),
    /// A Raft entry with no command (a leader's blank entry, a membership change).
    Nothing,
}

/// A command the state refuses; it changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Refused {
    #[error("topic {0:?} does not exist")]
    NoSuchTopic(String),
    #[error("dead-letter topic {0:?} does not exist")]
    NoSuchDeadLetterTopic(String),
    #[error("a topic cannot be its own dead-letter topic")]
    OwnDeadLetterTopic,
    #[error("max_deliveries > 0 needs a dead_letter_topic")]
    MaxDeliveriesWithoutDeadLetterTopic,
    #[error("partitions cannot shrink from {from} to {to}")]
    FewerPartitions { from: u32, to: u32 },
    #[error("topic {topic:?} is the dead-letter topic of {by:?}")]
    DeadLetterTopicInUse { topic: String, by: String },
    #[error("{needed} owners needed for the new partitions, {given} given")]
    OwnersMismatch { needed: usize, given: usize },
    #[error("user {0:?} does not exist")]
    NoSuchUser(String),
    #[error("user {user:?} has no token {id:?}")]
    NoSuchToken { user: String, id: String },
    #[error("schema {0:?} does not exist")]
    NoSuchSchema(String),
    #[error("schema {schema:?} is the schema of topic {topic:?}")]
    SchemaInUse { schema: String, topic: String },
    #[error("a token with id {0:?} exists")]
    TokenIdTaken(String),
    #[error("the user {0:?} cannot be deleted")]
    UndeletableUser(String),
    #[error("topic {parent:?} has no child {child:?}")]
    NoSuchChild { parent: String, child: String },
    #[error("a topic cannot be its own child")]
    OwnChild,
    #[error(
        "{parent:?} is itself a child of {grandparent:?}; children of children are not supported"
    )]
    ChildOfChild { parent: String, grandparent: String },
    #[error("a topic named {0:?} exists and is not a child of this parent; pick another name or delete it")]
    ChildTopicExists(String),
    #[error("child {child:?} is a {from} child; its kind cannot change to {to} (delete the child and its topic, then create it again, or create a {to} child under another name)")]
    ChildKindChange {
        child: String,
        from: String,
        to: String,
    },
    #[error("topic {topic:?} has children {children:?}; delete them first")]
    HasChildren {
        topic: String,
        children: Vec<String>,
    },
    #[error("a delay of {delay_ms} ms needs the parent {parent:?} to keep messages at least {needed_ms} ms (retention_ms is {retention_ms})")]
    RetentionBelowDelay {
        parent: String,
        delay_ms: u64,
        retention_ms: u64,
        needed_ms: u64,
    },
    #[error("retention_ms {retention_ms} is shorter than the delay child {child:?} needs ({needed_ms} ms: its delay plus one hour)")]
    RetentionBreaksDelayChild {
        child: String,
        retention_ms: u64,
        needed_ms: u64,
    },
    #[error("a replica child has its parent's partition count ({parent}), not {given}")]
    ReplicaPartitions { parent: u32, given: u32 },
    #[error("partition {partition} of a replica child must be on another node than its parent partition's owner {owner}")]
    ReplicaPlacement { partition: u32, owner: NodeId },
    #[error("topic {dlq:?} has no redrive {id:?}")]
    NoSuchRedrive { dlq: String, id: String },
    #[error("a redrive moves messages to another topic, not back into {0:?}")]
    RedriveToItself(String),
    #[error("a redrive with id {0:?} exists")]
    RedriveIdTaken(String),
    #[error("{dlq:?} has {running} redrives running, the most it may; cancel one or wait for one to end")]
    TooManyRedrives { dlq: String, running: usize },
    #[error("node {id} is a member at {addr}; remove it before admitting it at another address")]
    MemberAddressTaken { id: NodeId, addr: String },
    #[error("node {0} is not a member of the cluster")]
    NoSuchNode(NodeId),
    #[error("there is no move {0:?}")]
    NoSuchMove(String),
    #[error("move {id:?} is {state}, not planned")]
    MoveNotPlanned { id: String, state: String },
    #[error("move {id:?} is {state}, not running")]
    MoveNotRunning { id: String, state: String },
    #[error("{running} moves run already, the most cluster.max_concurrent_moves allows")]
    TooManyMoves { running: usize },
    #[error("partition {partition} of {topic:?} is not owned by node {from}")]
    MoveSourceNotOwner {
        topic: String,
        partition: u32,
        from: NodeId,
    },
    #[error("node {0} cannot take partitions (it is dead, decommissioning or unknown)")]
    MoveTargetUnfit(NodeId),
    #[error("partition {partition} of {topic:?} is moving already")]
    PartitionMoving { topic: String, partition: u32 },
    #[error("node {node} still owns {partitions} partitions or takes part in a move; decommission it first and wait for its moves to end")]
    NodeOwnsPartitions { node: NodeId, partitions: usize },
    #[error(
        "node {0} is alive and not decommissioned; decommission it (or stop it) before removing it"
    )]
    NodeInService(NodeId),
    #[error("{topic:?} is in a replica pair with {other:?}; its partition count cannot change")]
    ReplicaPartitionsFixed { topic: String, other: String },
}

/// The user that holds every grant, bootstrapped from `auth.admin_password`.
pub const ADMIN_USER: &str = "admin";

/// Everything the metastore holds; one applied index versions it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    pub topics: BTreeMap<String, Topic>,
    pub next_incarnation: u64,
    /// Set once by the first leader; absent in folders of older builds
    /// until a leader sets it.
    #[serde(default)]
    pub cluster_id: Option<String>,
    /// Liveness of every node the controller has judged.
    #[serde(default)]
    pub nodes: BTreeMap<NodeId, NodeRecord>,
    /// Users by name (absent in folders of older builds).
    #[serde(default)]
    pub users: BTreeMap<String, User>,
    /// Bearer tokens by id.
    #[serde(default)]
    pub tokens: BTreeMap<String, Token>,
    /// Schemas by name.
    #[serde(default)]
    pub schemas: BTreeMap<String, Schema>,
    /// Dead-letter redrives by id.
    #[serde(default)]
    pub redrives: BTreeMap<String, Redrive>,
    /// Partition moves by id (zero-padded, in plan order).
    #[serde(default)]
    pub moves: BTreeMap<String, Move>,
    #[serde(default)]
    pub next_move: u64,
    /// Nodes removed from the cluster: the controller does not record
    /// them again (until one is admitted anew).
    #[serde(default)]
    pub removed_nodes: std::collections::BTreeSet<NodeId>,
    /// The Kafka listener's advertised address of each node that has one.
    #[serde(default)]
    pub kafka_addrs: BTreeMap<NodeId, String>,
}

impl MetaState {
    pub fn apply(&mut self, command: &Command) -> Result<Applied, Refused> {
        match command {
            Command::PutTopic {
                name,
                config,
                new_owners,
                now_ms,
            } => self.put_topic(name, config, new_owners, *now_ms),
            Command::DeleteTopic { name } => self.delete_topic(name),
            Command::InitCluster { cluster_id } => {
                if self.cluster_id.is_none() {
                    self.cluster_id = Some(cluster_id.clone());
                    return Ok(Applied::ClusterChanged);
                }
                Ok(Applied::Nothing)
            }
            Command::SetNodeState {
                id,
                addr,
                alive,
                now_ms,
            } => {
                if self.removed_nodes.contains(id) {
                    return Ok(Applied::Nothing);
                }
                let record = NodeRecord {
                    addr: addr.clone(),
                    alive: *alive,
                    since_ms: *now_ms,
                    decommissioning: self.decommissioning(*id),
                };
                match self.nodes.get(id) {
                    Some(old) if old.alive == *alive && old.addr == *addr => Ok(Applied::Nothing),
                    _ => {
                        self.nodes.insert(*id, record);
                        Ok(Applied::ClusterChanged)
                    }
                }
            }
            Command::SetKafkaAddress { id, addr } => {
                let changed = match addr {
                    Some(addr) => self.kafka_addrs.insert(*id, addr.clone()).as_ref() != Some(addr),
                    None => self.kafka_addrs.remove(id).is_some(),
                };
                Ok(if changed {
                    Applied::ClusterChanged
                } else {
                    Applied::Nothing
                })
            }
            Command::PutUser {
                name,
                password_hash,
                if_absent,
                now_ms,
            } => match self.users.get_mut(name) {
                Some(_) if *if_absent => Ok(Applied::Nothing),
                Some(user) => {
                    user.password_hash = password_hash.clone();
                    Ok(Applied::UserChanged)
                }
                None => {
                    self.users.insert(
                        name.clone(),
                        User {
                            password_hash: password_hash.clone(),
                            grants: Vec::new(),
                            created_at_ms: *now_ms,
                        },
                    );
                    Ok(Applied::UserCreated)
                }
            },
            Command::DeleteUser { name } => {
                if name == ADMIN_USER {
                    return Err(Refused::UndeletableUser(name.clone()));
                }
                if self.users.remove(name).is_none() {
                    return Err(Refused::NoSuchUser(name.clone()));
                }
                self.tokens.retain(|_, token| token.user != *name);
                Ok(Applied::UserChanged)
            }
            Command::SetGrants { user, grants } => {
                let record = self
                    .users
                    .get_mut(user)
                    .ok_or_else(|| Refused::NoSuchUser(user.clone()))?;
                record.grants = grants.clone();
                Ok(Applied::UserChanged)
            }
            Command::AddToken {
                user,
                id,
                secret_hash,
                now_ms,
            } => {
                if !self.users.contains_key(user) {
                    return Err(Refused::NoSuchUser(user.clone()));
                }
                if self.tokens.contains_key(id) {
                    return Err(Refused::TokenIdTaken(id.clone()));
                }
                self.tokens.insert(
                    id.clone(),
                    Token {
                        user: user.clone(),
                        secret_hash: secret_hash.clone(),
                        created_at_ms: *now_ms,
                    },
                );
                Ok(Applied::UserChanged)
            }
            Command::RevokeToken { user, id } => match self.tokens.get(id) {
                Some(token) if token.user == *user => {
                    self.tokens.remove(id);
                    Ok(Applied::UserChanged)
                }
                _ => Err(Refused::NoSuchToken {
                    user: user.clone(),
                    id: id.clone(),
                }),
            },
            Command::PutSchema { name, document } => {
                let created = !self.schemas.contains_key(name);
                let schema = self.schemas.entry(name.clone()).or_insert(Schema {
                    versions: Vec::new(),
                });
                // The same document again is no new version.
                if schema.versions.last() != Some(document) {
                    schema.versions.push(document.clone());
                }
                Ok(Applied::SchemaPut {
                    version: schema.latest().0,
                    created,
                })
            }
            Command::DeleteSchema { name } => {
                if !self.schemas.contains_key(name) {
                    return Err(Refused::NoSuchSchema(name.clone()));
                }
                if let Some(topic) = self
                    .topics
                    .values()
                    .find(|t| t.config.schema.as_deref() == Some(name))
                {
                    return Err(Refused::SchemaInUse {
                        schema: name.clone(),
                        topic: topic.name.clone(),
                    });
                }
                self.schemas.remove(name);
                Ok(Applied::SchemaDeleted)
            }
            Command::PlanMoves {
                moves,
                decommission,
                now_ms,
            } => self.plan_moves(moves, *decommission, *now_ms),
            Command::StartMove {
                id,
                max_running,
                now_ms,
            } => self.start_move(id, *max_running, *now_ms),
            Command::MoveProgress {
                id,
                copied_bytes,
                total_bytes,
                rate_bytes_per_s,
                freezing,
            } => self.move_progress(
                id,
                *copied_bytes,
                *total_bytes,
                *rate_bytes_per_s,
                *freezing,
            ),
            Command::EndMove { id, end, now_ms } => self.end_move(id, end, *now_ms),
            Command::AdmitNode { id, addr, now_ms } => Ok(self.admit_node(*id, addr, *now_ms)),
            Command::RemoveNode { id, member } => self.remove_node(*id, *member),
            Command::PutChild {
                parent,
                child,
                kind,
                config,
                new_owners,
                now_ms,
            } => self.put_child(parent, child, kind.clone(), config, new_owners, *now_ms),
            Command::PutRemoteChild {
                parent,
                child,
                remote,
                now_ms,
            } => self.put_remote_child(parent, child, remote, *now_ms),
            Command::StartRedrive {
                id,
                dlq,
                to,
                rate_per_s,
                max_messages,
                node,
                now_ms,
            } => {
                for topic in [dlq, to] {
                    if !self.topics.contains_key(topic) {
                        return Err(Refused::NoSuchTopic(topic.clone()));
                    }
                }
                if dlq == to {
                    return Err(Refused::RedriveToItself(dlq.clone()));
                }
                if self.redrives.contains_key(id) {
                    return Err(Refused::RedriveIdTaken(id.clone()));
                }
                let running = self
                    .redrives
                    .values()
                    .filter(|r| r.dlq == *dlq && r.state == RedriveState::Running)
                    .count();
                if running >= REDRIVES_RUNNING_MAX {
                    return Err(Refused::TooManyRedrives {
                        dlq: dlq.clone(),
                        running,
                    });
                }
                // Keep the last few finished ones of this topic listed.
                let mut finished: Vec<(u64, String)> = self
                    .redrives
                    .iter()
                    .filter(|(_, r)| r.dlq == *dlq && r.state != RedriveState::Running)
                    .map(|(id, r)| (r.created_at_ms, id.clone()))
                    .collect();
                finished.sort();
                let excess = (finished.len() + 1).saturating_sub(REDRIVES_KEPT);
                for (_, old) in finished.into_iter().take(excess) {
                    self.redrives.remove(&old);
                }
                let redrive = Redrive {
                    dlq: dlq.clone(),
                    to: to.clone(),
                    rate_per_s: *rate_per_s,
                    max_messages: *max_messages,
                    node: *node,
                    moved: 0,
                    state: RedriveState::Running,
                    created_at_ms: *now_ms,
                };
                self.redrives.insert(id.clone(), redrive.clone());
                Ok(Applied::RedriveChanged(redrive))
            }
            Command::RedriveProgress { id, moved, state } => match self.redrives.get_mut(id) {
                Some(redrive) => {
                    redrive.moved = redrive.moved.max(*moved);
                    if let (Some(state), RedriveState::Running) = (state, &redrive.state) {
                        redrive.state = state.clone();
                    }
                    Ok(Applied::RedriveChanged(redrive.clone()))
                }
                // Gone with its topic.
                None => Ok(Applied::Nothing),
            },
            Command::CancelRedrive { dlq, id } => match self.redrives.get_mut(id) {
                Some(redrive) if redrive.dlq == *dlq => {
                    if redrive.state == RedriveState::Running {
                        redrive.state = RedriveState::Cancelled;
                    }
                    Ok(Applied::RedriveChanged(redrive.clone()))
                }
                _ => Err(Refused::NoSuchRedrive {
                    dlq: dlq.clone(),
                    id: id.clone(),
                }),
            },
            Command::DeleteChild { parent, child } => {
                let removed = self
                    .topics
                    .get_mut(parent)
                    .and_then(|p| p.children.remove(child));
                let Some(removed) = removed else {
                    return Err(Refused::NoSuchChild {
                        parent: parent.clone(),
                        child: child.clone(),
                    });
                };
                if removed.kind.is_local() {
                    if let Some(topic) = self.topics.get_mut(child) {
                        topic.parent = None;
                    }
                }
                Ok(Applied::ChildDeleted)
            }
        }
    }

    fn put_child(
        &mut self,
        parent: &str,
        child: &str,
        kind: ChildKind,
        config: &TopicConfig,
        new_owners: &[NodeId],
        now_ms: u64,
    ) -> Result<Applied, Refused> {
        if parent == child {
            return Err(Refused::OwnChild);
        }
        let Some(parent_topic) = self.topics.get(parent) else {
            return Err(Refused::NoSuchTopic(parent.to_string()));
        };
        if let Some(grandparent) = &parent_topic.parent {
            return Err(Refused::ChildOfChild {
                parent: parent.to_string(),
                grandparent: grandparent.clone(),
            });
        }
        let existing = self.topics.get(child);
        let created = match (existing, parent_topic.children.get(child)) {
            (_, Some(link)) if !link.kind.is_local() => {
                return Err(Refused::ChildKindChange {
                    child: child.to_string(),
                    from: link.kind.name().to_string(),
                    to: kind.name().to_string(),
                });
            }
            (Some(topic), Some(link)) if topic.parent.as_deref() == Some(parent) => {
                if std::mem::discriminant(&link.kind) != std::mem::discriminant(&kind) {
                    return Err(Refused::ChildKindChange {
                        child: child.to_string(),
                        from: link.kind.name().to_string(),
                        to: kind.name().to_string(),
                    });
                }
                false
            }
            (Some(_), _) => return Err(Refused::ChildTopicExists(child.to_string())),
            (None, _) => true,
        };
        if let ChildKind::Delay { delay_ms } = kind {
            let retention_ms = parent_topic.config.retention_ms;
            if !retention_covers_delay(retention_ms, delay_ms) {
                return Err(Refused::RetentionBelowDelay {
                    parent: parent.to_string(),
                    delay_ms,
                    retention_ms,
                    needed_ms: delay_ms.saturating_add(DELAY_RETENTION_MARGIN_MS),
                });
            }
        }
        if kind == ChildKind::Replica {
            if config.partitions != parent_topic.config.partitions {
                return Err(Refused::ReplicaPartitions {
                    parent: parent_topic.config.partitions,
                    given: config.partitions,
                });
            }
            if created {
                for (partition, (owner, replica)) in
                    (0u32..).zip(parent_topic.owners.iter().zip(new_owners))
                {
                    if owner == replica {
                        return Err(Refused::ReplicaPlacement {
                            partition,
                            owner: *owner,
                        });
                    }
                }
            }
        }
        let topic = match self.put_topic(child, config, new_owners, now_ms)? {
            Applied::TopicCreated(topic)
            | Applied::TopicUpdated(topic)
            | Applied::TopicUnchanged(topic) => topic,
            _ => return Err(Refused::NoSuchTopic(child.to_string())),
        };
        let incarnation = topic.incarnation;
        if let Some(record) = self.topics.get_mut(child) {
            record.parent = Some(parent.to_string());
        }
        if let Some(parent_topic) = self.topics.get_mut(parent) {
            let link = parent_topic
                .children
                .entry(child.to_string())
                .or_insert(Child {
                    kind: kind.clone(),
                    incarnation,
                    created_at_ms: now_ms,
                });
            link.kind = kind;
        }
        let topic = self.topics.get(child).cloned().unwrap_or(topic);
        Ok(Applied::ChildPut { topic, created })
    }

    /// A remote child is a link of its parent alone: its name may be that
    /// of a local topic, which it does not touch. Created again, it starts
    /// afresh (a new incarnation, so new cursors).
    fn put_remote_child(
        &mut self,
        parent: &str,
        child: &str,
        remote: &RemoteTarget,
        now_ms: u64,
    ) -> Result<Applied, Refused> {
        if parent == child {
            return Err(Refused::OwnChild);
        }
        let next_incarnation = self.next_incarnation;
        let Some(parent_topic) = self.topics.get_mut(parent) else {
            return Err(Refused::NoSuchTopic(parent.to_string()));
        };
        if let Some(grandparent) = &parent_topic.parent {
            return Err(Refused::ChildOfChild {
                parent: parent.to_string(),
                grandparent: grandparent.clone(),
            });
        }
        let kind = ChildKind::Remote {
            remote: Box::new(remote.clone()),
        };
        let created = match parent_topic.children.get_mut(child) {
            Some(link) if link.kind.is_local() => {
                return Err(Refused::ChildKindChange {
                    child: child.to_string(),
                    from: link.kind.name().to_string(),
                    to: kind.name().to_string(),
                });
            }
            Some(link) => {
                link.kind = kind;
                false
            }
            None => {
                parent_topic.children.insert(
                    child.to_string(),
                    Child {
                        kind,
                        incarnation: next_incarnation,
                        created_at_ms: now_ms,
                    },
                );
                true
            }
        };
        if created {
            self.next_incarnation += 1;
        }
        let link = self
            .topics
            .get(parent)
            .and_then(|p| p.children.get(child))
            .cloned()
            .ok_or_else(|| Refused::NoSuchTopic(parent.to_string()))?;
        Ok(Applied::RemoteChildPut { link, created })
    }

    fn put_topic(
        &mut self,
        name: &str,
        config: &TopicConfig,
        new_owners: &[NodeId],
        now_ms: u64,
    ) -> Result<Applied, Refused> {
        match &config.dead_letter_topic {
            Some(dlq) if dlq == name => return Err(Refused::OwnDeadLetterTopic),
            Some(dlq) if !self.topics.contains_key(dlq) => {
                return Err(Refused::NoSuchDeadLetterTopic(dlq.clone()))
            }
            None if config.max_deliveries > 0 => {
                return Err(Refused::MaxDeliveriesWithoutDeadLetterTopic)
            }
            _ => {}
        }
        if let Some(schema) = &config.schema {
            if !self.schemas.contains_key(schema) {
                return Err(Refused::NoSuchSchema(schema.clone()));
            }
        }
        if let Some(existing) = self.topics.get(name) {
            self.check_family(existing, config)?;
        }
        let existing_partitions = self.topics.get(name).map_or(0, |t| t.config.partitions);
        if config.partitions < existing_partitions {
            return Err(Refused::FewerPartitions {
                from: existing_partitions,
                to: config.partitions,
            });
        }
        let needed = usize::try_from(config.partitions - existing_partitions).unwrap_or(usize::MAX);
        if new_owners.len() != needed {
            return Err(Refused::OwnersMismatch {
                needed,
                given: new_owners.len(),
            });
        }
        match self.topics.get_mut(name) {
            Some(topic) if topic.config == *config => Ok(Applied::TopicUnchanged(topic.clone())),
            Some(topic) => {
                topic.config = config.clone();
                topic.owners.extend_from_slice(new_owners);
                Ok(Applied::TopicUpdated(topic.clone()))
            }
            None => {
                let topic = Topic {
                    name: name.to_string(),
                    config: config.clone(),
                    owners: new_owners.to_vec(),
                    incarnation: self.next_incarnation,
                    created_at_ms: now_ms,
                    children: BTreeMap::new(),
                    parent: None,
                };
                self.next_incarnation += 1;
                self.topics.insert(name.to_string(), topic.clone());
                Ok(Applied::TopicCreated(topic))
            }
        }
    }

    /// What a change of `topic`'s config must keep for its children and
    /// its parent: the retention its delay children need, and a replica
    /// pair's equal partition counts.
    fn check_family(&self, topic: &Topic, config: &TopicConfig) -> Result<(), Refused> {
        for (name, child) in &topic.children {
            match child.kind {
                ChildKind::Delay { delay_ms }
                    if !retention_covers_delay(config.retention_ms, delay_ms) =>
                {
                    return Err(Refused::RetentionBreaksDelayChild {
                        child: name.clone(),
                        retention_ms: config.retention_ms,
                        needed_ms: delay_ms.saturating_add(DELAY_RETENTION_MARGIN_MS),
                    });
                }
                ChildKind::Replica if config.partitions != topic.config.partitions => {
                    return Err(Refused::ReplicaPartitionsFixed {
                        topic: topic.name.clone(),
                        other: name.clone(),
                    });
                }
                _ => {}
            }
        }
        let replica_of = topic.parent.as_ref().filter(|parent| {
            self.topics
                .get(*parent)
                .and_then(|p| p.children.get(&topic.name))
                .is_some_and(|c| c.kind == ChildKind::Replica)
        });
        if let Some(parent) = replica_of {
            if config.partitions != topic.config.partitions {
                return Err(Refused::ReplicaPartitionsFixed {
                    topic: topic.name.clone(),
                    other: parent.clone(),
                });
            }
        }
        Ok(())
    }

    fn delete_topic(&mut self, name: &str) -> Result<Applied, Refused> {
        let Some(topic) = self.topics.get(name) else {
            return Err(Refused::NoSuchTopic(name.to_string()));
        };
        if !topic.children.is_empty() {
            return Err(Refused::HasChildren {
                topic: name.to_string(),
                children: topic.children.keys().cloned().collect(),
            });
        }
        if let Some(user) = self
            .topics
            .values()
            .find(|t| t.name != name && t.config.dead_letter_topic.as_deref() == Some(name))
        {
            return Err(Refused::DeadLetterTopicInUse {
                topic: name.to_string(),
                by: user.name.clone(),
            });
        }
        // Refusals above, changes below: a refused delete changes nothing.
        let parent = topic.parent.clone();
        // Its redrives go with it; those into it end.
        self.redrives.retain(|_, r| r.dlq != name);
        self.abandon_moves_of(name, None);
        for redrive in self.redrives.values_mut() {
            if redrive.to == name && redrive.state == RedriveState::Running {
                redrive.state = RedriveState::Failed(format!("topic {name:?} was deleted"));
            }
        }
        // Deleting a child stops its copy.
        if let Some(parent) = parent.and_then(|p| self.topics.get_mut(&p)) {
            parent.children.remove(name);
        }
        self.topics.remove(name);
        Ok(Applied::TopicDeleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(partitions: u32) -> TopicConfig {
        TopicConfig {
            partitions,
            visibility_timeout_ms: 30_000,
            retention_ms: 604_800_000,
            max_deliveries: 0,
            dead_letter_topic: None,
            schema: None,
            max_message_bytes: 1 << 20,
            idempotency_window_ms: IDEMPOTENCY_WINDOW_MS_DEFAULT,
        }
    }

    fn put(
        state: &mut MetaState,
        name: &str,
        config: TopicConfig,
        owners: Vec<NodeId>,
    ) -> Result<Applied, Refused> {
        state.apply(&Command::PutTopic {
            name: name.into(),
            config,
            new_owners: owners,
            now_ms: 5,
        })
    }

    #[test]
    fn create_update_unchanged_and_grow() {
        let mut state = MetaState::default();
        assert!(matches!(
            put(&mut state, "orders", config(2), vec![1, 1]),
            Ok(Applied::TopicCreated(_))
        ));
        assert!(matches!(
            put(&mut state, "orders", config(2), vec![]),
            Ok(Applied::TopicUnchanged(_))
        ));
        let Ok(Applied::TopicUpdated(topic)) = put(&mut state, "orders", config(3), vec![1]) else {
            panic!("grows")
        };
        assert_eq!(topic.owners, vec![1, 1, 1]);
        assert_eq!(
            put(&mut state, "orders", config(1), vec![]),
            Err(Refused::FewerPartitions { from: 3, to: 1 })
        );
        assert_eq!(
            put(&mut state, "x", config(2), vec![1]),
            Err(Refused::OwnersMismatch {
                needed: 2,
                given: 1
            })
        );
    }

    #[test]
    fn a_remote_child_is_a_link_whose_target_changes_in_place_and_whose_token_stays_hidden() {
        let mut state = MetaState::default();
        put(&mut state, "orders", config(2), vec![1, 1]).expect("parent");
        put(&mut state, "far", config(1), vec![1]).expect("a local topic named as the child");
        let target = |token: &str| RemoteTarget {
            url: "https://dr.example:8443".into(),
            topic: "orders".into(),
            token: Some(token.into()),
            rate_bytes_per_s: None,
        };
        let remote = |state: &mut MetaState, token: &str| {
            state.apply(&Command::PutRemoteChild {
                parent: "orders".into(),
                child: "far".into(),
                remote: Box::new(target(token)),
                now_ms: 7,
            })
        };
        let Ok(Applied::RemoteChildPut {
            link: first,
            created: true,
        }) = remote(&mut state, "tok-one")
        else {
            panic!("created")
        };
        assert_eq!(first.created_at_ms, 7);
        assert!(
            state.topics["far"].parent.is_none(),
            "the local topic is untouched"
        );
        // A new token: the same link (same cursors), the new target.
        let Ok(Applied::RemoteChildPut {
            link: second,
            created: false,
        }) = remote(&mut state, "tok-two")
        else {
            panic!("updated")
        };
        assert_eq!(second.incarnation, first.incarnation);
        assert_eq!(
            second.kind,
            ChildKind::Remote {
                remote: Box::new(target("tok-two"))
            }
        );
        // Neither kind turns into the other.
        assert!(matches!(
            put_child(
                &mut state,
                "orders",
                "far",
                ChildKind::Fanout,
                config(2),
                vec![1, 1]
            ),
            Err(Refused::ChildKindChange { .. })
        ));
        put_child(
            &mut state,
            "orders",
            "audit",
            ChildKind::Fanout,
            config(2),
            vec![1, 1],
        )
        .expect("a local child");
        assert!(matches!(
            state.apply(&Command::PutRemoteChild {
                parent: "orders".into(),
                child: "audit".into(),
                remote: Box::new(target("x")),
                now_ms: 8,
            }),
            Err(Refused::ChildKindChange { .. })
        ));
        assert!(!format!("{:?}", state.topics["orders"]).contains("tok-two"));
        // Deleted, the local topic of that name stays as it was; created
        // again, a new incarnation.
        state
            .apply(&Command::DeleteChild {
                parent: "orders".into(),
                child: "far".into(),
            })
            .expect("deleted");
        assert!(state.topics.contains_key("far"));
        let Ok(Applied::RemoteChildPut { link: third, .. }) = remote(&mut state, "tok-three")
        else {
            panic!("created again")
        };
        assert_ne!(third.incarnation, first.incarnation);
    }

    fn put_child(
        state: &mut MetaState,
        parent: &str,
        child: &str,
        kind: ChildKind,
        config: TopicConfig,
        owners: Vec<NodeId>,
    ) -> Result<Applied, Refused> {
        state.apply(&Command::PutChild {
            parent: parent.into(),
            child: child.into(),
            kind,
            config,
            new_owners: owners,
            now_ms: 9,
        })
    }

    #[test]
    fn children_are_created_linked_guarded_and_unlinked() {
        let mut state = MetaState::default();
        put(&mut state, "orders", config(2), vec![1, 2]).expect("parent");
        let Ok(Applied::ChildPut {
            topic,
            created: true,
        }) = put_child(
            &mut state,
            "orders",
            "audit",
            ChildKind::Fanout,
            config(3),
            vec![1, 2, 3],
        )
        else {
            panic!("child created")
        };
        assert_eq!(topic.parent.as_deref(), Some("orders"));
        let link = &state.topics["orders"].children["audit"];
        assert_eq!(
            (link.kind.clone(), link.incarnation, link.created_at_ms),
            (ChildKind::Fanout, topic.incarnation, 9)
        );
        // Again: updated, not created; the kind cannot change.
        assert!(matches!(
            put_child(
                &mut state,
                "orders",
                "audit",
                ChildKind::Fanout,
                config(3),
                vec![]
            ),
            Ok(Applied::ChildPut { created: false, .. })
        ));
        assert!(matches!(
            put_child(
                &mut state,
                "orders",
                "audit",
                ChildKind::Replica,
                config(2),
                vec![]
            ),
            Err(Refused::ChildKindChange { .. })
        ));
        // Children of children, own child, a name taken by a plain topic.
        assert!(matches!(
            put_child(
                &mut state,
                "audit",
                "deeper",
                ChildKind::Fanout,
                config(1),
                vec![1]
            ),
            Err(Refused::ChildOfChild { .. })
        ));
        assert_eq!(
            put_child(
                &mut state,
                "orders",
                "orders",
                ChildKind::Fanout,
                config(1),
                vec![1]
            ),
            Err(Refused::OwnChild)
        );
        put(&mut state, "plain", config(1), vec![1]).expect("plain");
        assert_eq!(
            put_child(
                &mut state,
                "orders",
                "plain",
                ChildKind::Fanout,
                config(1),
                vec![]
            ),
            Err(Refused::ChildTopicExists("plain".into()))
        );
        // A parent with children is not deleted; the list names them.
        assert_eq!(
            state.apply(&Command::DeleteTopic {
                name: "orders".into()
            }),
            Err(Refused::HasChildren {
                topic: "orders".into(),
                children: vec!["audit".into()]
            })
        );
        // Deleting the link keeps the child topic.
        assert_eq!(
            state.apply(&Command::DeleteChild {
                parent: "orders".into(),
                child: "audit".into()
            }),
            Ok(Applied::ChildDeleted)
        );
        assert!(state.topics["audit"].parent.is_none());
        assert!(state.topics["orders"].children.is_empty());
        assert!(matches!(
            state.apply(&Command::DeleteChild {
                parent: "orders".into(),
                child: "audit".into()
            }),
            Err(Refused::NoSuchChild { .. })
        ));
        // A child that is another topic's dead-letter topic stays, linked.
        put_child(
            &mut state,
            "orders",
            "copy",
            ChildKind::Fanout,
            config(1),
            vec![1],
        )
        .expect("child");
        let uses_copy = TopicConfig {
            max_deliveries: 1,
            dead_letter_topic: Some("copy".into()),
            ..config(1)
        };
        put(&mut state, "user", uses_copy, vec![1]).expect("user");
        assert!(matches!(
            state.apply(&Command::DeleteTopic {
                name: "copy".into()
            }),
            Err(Refused::DeadLetterTopicInUse { .. })
        ));
        assert!(state.topics["orders"].children.contains_key("copy"));
        state
            .apply(&Command::DeleteTopic {
                name: "user".into(),
            })
            .expect("user deleted");
        // Deleting a child topic unlinks it.
        state
            .apply(&Command::DeleteTopic {
                name: "copy".into(),
            })
            .expect("child deleted");
        assert!(state.topics["orders"].children.is_empty());
    }

    #[test]
    fn delay_children_keep_their_retention_and_replicas_their_placement() {
        let mut state = MetaState::default();
        let retention = |ms: u64| TopicConfig {
            retention_ms: ms,
            ..config(2)
        };
        put(&mut state, "orders", retention(2 * 3_600_000), vec![1, 2]).expect("parent");
        let delay = |ms| ChildKind::Delay { delay_ms: ms };
        assert!(matches!(
            put_child(
                &mut state,
                "orders",
                "later",
                delay(3_600_001),
                config(2),
                vec![1, 2]
            ),
            Err(Refused::RetentionBelowDelay { .. })
        ));
        put_child(
            &mut state,
            "orders",
            "later",
            delay(3_600_000),
            config(2),
            vec![1, 2],
        )
        .expect("delay child");
        assert!(matches!(
            put(&mut state, "orders", retention(2 * 3_600_000 - 1), vec![]),
            Err(Refused::RetentionBreaksDelayChild { .. })
        ));
        put(&mut state, "orders", retention(0), vec![]).expect("forever covers any delay");
        // A replica: same partition count, each partition away from its parent's owner.
        assert!(matches!(
            put_child(
                &mut state,
                "orders",
                "dr",
                ChildKind::Replica,
                config(3),
                vec![2, 1, 1]
            ),
            Err(Refused::ReplicaPartitions {
                parent: 2,
                given: 3
            })
        ));
        assert_eq!(
            put_child(
                &mut state,
                "orders",
                "dr",
                ChildKind::Replica,
                config(2),
                vec![2, 2]
            ),
            Err(Refused::ReplicaPlacement {
                partition: 1,
                owner: 2
            })
        );
        put_child(
            &mut state,
            "orders",
            "dr",
            ChildKind::Replica,
            config(2),
            vec![2, 1],
        )
        .expect("replica");
        assert!(matches!(
            put(
                &mut state,
                "orders",
                TopicConfig {
                    retention_ms: 0,
                    ..config(3)
                },
                vec![1]
            ),
            Err(Refused::ReplicaPartitionsFixed { .. })
        ));
        assert!(matches!(
            put(&mut state, "dr", config(3), vec![1]),
            Err(Refused::ReplicaPartitionsFixed { .. })
        ));
    }

    #[test]
    fn redrives_start_report_end_cancel_and_go_with_their_topic() {
        let mut state = MetaState::default();
        put(&mut state, "orders", config(1), vec![1]).expect("orders");
        put(&mut state, "dlq", config(1), vec![1]).expect("dlq");
        let start = |id: &str, to: &str, now_ms| Command::StartRedrive {
            id: id.into(),
            dlq: "dlq".into(),
            to: to.into(),
            rate_per_s: Some(10),
            max_messages: None,
            node: 1,
            now_ms,
        };
        assert_eq!(
            state.apply(&start("r1", "dlq", 1)),
            Err(Refused::RedriveToItself("dlq".into()))
        );
        assert_eq!(
            state.apply(&start("r1", "nowhere", 1)),
            Err(Refused::NoSuchTopic("nowhere".into()))
        );
        state.apply(&start("r1", "orders", 1)).expect("started");
        assert_eq!(
            state.apply(&start("r1", "orders", 2)),
            Err(Refused::RedriveIdTaken("r1".into()))
        );
        let progress = |moved, end: Option<RedriveState>| Command::RedriveProgress {
            id: "r1".into(),
            moved,
            state: end,
        };
        state.apply(&progress(5, None)).expect("progress");
        assert_eq!(state.redrives["r1"].moved, 5);
        // Cancelled stays cancelled whatever its node reports next.
        let cancel = Command::CancelRedrive {
            dlq: "dlq".into(),
            id: "r1".into(),
        };
        state.apply(&cancel).expect("cancel");
        state
            .apply(&progress(7, Some(RedriveState::Done)))
            .expect("late report");
        assert_eq!(state.redrives["r1"].state, RedriveState::Cancelled);
        assert_eq!(state.redrives["r1"].moved, 7);
        assert!(matches!(
            state.apply(&Command::CancelRedrive {
                dlq: "orders".into(),
                id: "r1".into()
            }),
            Err(Refused::NoSuchRedrive { .. })
        ));
        // A few may run at once.
        for i in 0..REDRIVES_RUNNING_MAX {
            state
                .apply(&start(&format!("run{i}"), "orders", 3))
                .expect("start");
        }
        assert!(matches!(
            state.apply(&start("one-too-many", "orders", 4)),
            Err(Refused::TooManyRedrives { .. })
        ));
        for i in 0..REDRIVES_RUNNING_MAX {
            state
                .apply(&Command::CancelRedrive {
                    dlq: "dlq".into(),
                    id: format!("run{i}"),
                })
                .expect("cancel");
        }
        // Only the last few finished ones stay listed.
        for i in 0..(REDRIVES_KEPT as u64 + 5) {
            let id = format!("x{i}");
            state.apply(&start(&id, "orders", 10 + i)).expect("start");
            state
                .apply(&Command::RedriveProgress {
                    id,
                    moved: 1,
                    state: Some(RedriveState::Done),
                })
                .expect("done");
        }
        assert_eq!(state.redrives.len(), REDRIVES_KEPT);
        // A deleted target fails a running one; a deleted topic takes its own.
        state.apply(&start("live", "orders", 100)).expect("start");
        state
            .apply(&Command::DeleteTopic {
                name: "orders".into(),
            })
            .expect("delete");
        assert!(matches!(
            state.redrives["live"].state,
            RedriveState::Failed(_)
        ));
        state
            .apply(&Command::DeleteTopic { name: "dlq".into() })
            .expect("delete");
        assert!(state.redrives.is_empty());
    }

    #[test]
    fn dead_letter_rules_hold() {
        let mut state = MetaState::default();
        let with_dlq = |dlq: &str| TopicConfig {
            max_deliveries: 3,
            dead_letter_topic: Some(dlq.into()),
            ..config(1)
        };
        assert_eq!(
            put(&mut state, "a", with_dlq("dlq"), vec![1]),
            Err(Refused::NoSuchDeadLetterTopic("dlq".into()))
        );
        assert_eq!(
            put(&mut state, "a", with_dlq("a"), vec![1]),
            Err(Refused::OwnDeadLetterTopic)
        );
        assert_eq!(
            put(
                &mut state,
                "a",
                TopicConfig {
                    max_deliveries: 3,
                    ..config(1)
                },
                vec![1]
            ),
            Err(Refused::MaxDeliveriesWithoutDeadLetterTopic)
        );
        put(&mut state, "dlq", config(1), vec![1]).expect("dlq");
        put(&mut state, "a", with_dlq("dlq"), vec![1]).expect("a");
        assert_eq!(
            state.apply(&Command::DeleteTopic { name: "dlq".into() }),
            Err(Refused::DeadLetterTopicInUse {
                topic: "dlq".into(),
                by: "a".into()
            })
        );
        assert_eq!(
            state.apply(&Command::DeleteTopic { name: "a".into() }),
            Ok(Applied::TopicDeleted)
        );
        assert_eq!(
            state.apply(&Command::DeleteTopic { name: "dlq".into() }),
            Ok(Applied::TopicDeleted)
        );
        assert_eq!(
            state.apply(&Command::DeleteTopic { name: "dlq".into() }),
            Err(Refused::NoSuchTopic("dlq".into()))
        );
    }

    #[test]
    fn users_tokens_and_grants_change_and_go_with_their_user() {
        let mut state = MetaState::default();
        let put_user = |state: &mut MetaState, name: &str, hash: &str, if_absent| {
            state.apply(&Command::PutUser {
                name: name.into(),
                password_hash: hash.into(),
                if_absent,
                now_ms: 1,
            })
        };
        assert_eq!(
            put_user(&mut state, "ann", "h1", false),
            Ok(Applied::UserCreated)
        );
        assert_eq!(
            put_user(&mut state, "ann", "h2", true),
            Ok(Applied::Nothing)
        );
        assert_eq!(state.users["ann"].password_hash, "h1");
        assert_eq!(
            put_user(&mut state, "ann", "h2", false),
            Ok(Applied::UserChanged)
        );
        assert_eq!(state.users["ann"].password_hash, "h2");
        let grants = vec![Grant {
            topic: "billing.*".into(),
            actions: vec![Action::Admin],
        }];
        state
            .apply(&Command::SetGrants {
                user: "ann".into(),
                grants: grants.clone(),
            })
            .expect("grants");
        assert_eq!(state.users["ann"].grants, grants);
        assert!(grants[0].matches("billing.eu") && !grants[0].matches("billing"));
        assert_eq!(
            state.apply(&Command::SetGrants {
                user: "bob".into(),
                grants: vec![]
            }),
            Err(Refused::NoSuchUser("bob".into()))
        );
        let token = |user: &str, id: &str| Command::AddToken {
            user: user.into(),
            id: id.into(),
            secret_hash: "x".into(),
            now_ms: 2,
        };
        state.apply(&token("ann", "t1")).expect("token");
        assert_eq!(
            state.apply(&token("bob", "t2")),
            Err(Refused::NoSuchUser("bob".into()))
        );
        put_user(&mut state, "bob", "h", false).expect("bob");
        state.apply(&token("bob", "t2")).expect("token");
        assert_eq!(
            state.apply(&Command::RevokeToken {
                user: "bob".into(),
                id: "t1".into()
            }),
            Err(Refused::NoSuchToken {
                user: "bob".into(),
                id: "t1".into()
            }),
            "a token is revoked only through its own user"
        );
        state
            .apply(&Command::DeleteUser { name: "ann".into() })
            .expect("delete");
        assert!(!state.tokens.contains_key("t1") && state.tokens.contains_key("t2"));
        put_user(&mut state, ADMIN_USER, "h", true).expect("admin");
        assert_eq!(
            state.apply(&Command::DeleteUser {
                name: ADMIN_USER.into()
            }),
            Err(Refused::UndeletableUser(ADMIN_USER.into()))
        );
    }

    #[test]
    fn schemas_keep_versions_and_cannot_go_while_a_topic_uses_them() {
        let mut state = MetaState::default();
        let put_schema = |state: &mut MetaState, document: &str| {
            state.apply(&Command::PutSchema {
                name: "order".into(),
                document: document.into(),
            })
        };
        assert_eq!(
            put_schema(&mut state, "{}"),
            Ok(Applied::SchemaPut {
                version: 1,
                created: true
            })
        );
        assert_eq!(
            put_schema(&mut state, "{\"type\":\"object\"}"),
            Ok(Applied::SchemaPut {
                version: 2,
                created: false
            })
        );
        assert_eq!(
            put_schema(&mut state, "{\"type\":\"object\"}"),
            Ok(Applied::SchemaPut {
                version: 2,
                created: false
            }),
            "the same document again is no new version"
        );
        let with_schema = |schema: &str| TopicConfig {
            schema: Some(schema.into()),
            ..config(1)
        };
        assert_eq!(
            put(&mut state, "t", with_schema("nope"), vec![1]),
            Err(Refused::NoSuchSchema("nope".into()))
        );
        put(&mut state, "t", with_schema("order"), vec![1]).expect("topic");
        assert_eq!(
            state.apply(&Command::DeleteSchema {
                name: "order".into()
            }),
            Err(Refused::SchemaInUse {
                schema: "order".into(),
                topic: "t".into()
            })
        );
        state
            .apply(&Command::DeleteTopic { name: "t".into() })
            .expect("topic goes");
        assert_eq!(
            state.apply(&Command::DeleteSchema {
                name: "order".into()
            }),
            Ok(Applied::SchemaDeleted)
        );
    }

    #[test]
    fn a_snapshot_of_an_older_build_loads_without_users_or_schemas() {
        let old = r#"{"topics":{},"next_incarnation":3,"cluster_id":"c","nodes":{}}"#;
        let state: MetaState = serde_json::from_str(old).expect("old snapshot");
        assert_eq!(state.next_incarnation, 3);
        assert!(state.users.is_empty() && state.tokens.is_empty() && state.schemas.is_empty());
    }

    #[test]
    fn a_topic_created_again_is_a_new_incarnation() {
        let mut state = MetaState::default();
        let Ok(Applied::TopicCreated(first)) = put(&mut state, "t", config(1), vec![1]) else {
            panic!("create")
        };
        state
            .apply(&Command::DeleteTopic { name: "t".into() })
            .expect("delete");
        let Ok(Applied::TopicCreated(second)) = put(&mut state, "t", config(1), vec![1]) else {
            panic!("again")
        };
        assert_ne!(first.incarnation, second.incarnation);
    }

    #[test]
    fn apply_is_deterministic_and_state_round_trips_through_a_snapshot() {
        let commands = vec![
            Command::PutTopic {
                name: "a".into(),
                config: config(2),
                new_owners: vec![1, 2],
                now_ms: 1,
            },
            Command::PutTopic {
                name: "b".into(),
                config: config(1),
                new_owners: vec![3],
                now_ms: 2,
            },
            Command::DeleteTopic { name: "a".into() },
            Command::PutTopic {
                name: "a".into(),
                config: config(4),
                new_owners: vec![1, 2, 3, 1],
                now_ms: 3,
            },
        ];
        let run = || {
            let mut state = MetaState::default();
            for command in &commands {
                let _ = state.apply(command);
            }
            state
        };
        let state = run();
        assert_eq!(state, run());
        let snapshot = serde_json::to_vec(&state).expect("serialise");
        let restored: MetaState = serde_json::from_slice(&snapshot).expect("deserialise");
        assert_eq!(restored, state);
    }
}

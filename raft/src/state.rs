//! The replicated state machine. `apply` must be deterministic: every node
//! applies the same commands in the same order and reaches the same state,
//! so it reads no clock and no randomness (the proposer puts times in the
//! command).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
}

/// What the controller knows about a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub addr: String,
    pub alive: bool,
    /// When the state last changed.
    pub since_ms: u64,
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
}

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
                let record = NodeRecord {
                    addr: addr.clone(),
                    alive: *alive,
                    since_ms: *now_ms,
                };
                match self.nodes.get(id) {
                    Some(old) if old.alive == *alive && old.addr == *addr => Ok(Applied::Nothing),
                    _ => {
                        self.nodes.insert(*id, record);
                        Ok(Applied::ClusterChanged)
                    }
                }
            }
        }
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
                };
                self.next_incarnation += 1;
                self.topics.insert(name.to_string(), topic.clone());
                Ok(Applied::TopicCreated(topic))
            }
        }
    }

    fn delete_topic(&mut self, name: &str) -> Result<Applied, Refused> {
        if !self.topics.contains_key(name) {
            return Err(Refused::NoSuchTopic(name.to_string()));
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

//! A seeded simulation of a whole cluster in one thread: three nodes of two
//! shards on simulated disks, a simulated network and a stand-in for the
//! metastore's decisions, all on a manual clock (`tests/sim/`). Producers,
//! consumers that ack, nack, extend, let leases lapse and hang up mid
//! request, and a nemesis that crashes nodes, cuts their power, cuts them
//! off (both ways, or one way only), slows or fills their disks and loses messages between them; one
//! scenario adds a fanout and a delay child to the topic. `narad-check`
//! judges each history exactly as it judges the process suites.
//!
//! `NARAD_SIM_ITERATIONS` (seeds, default [`ITERATIONS_DEFAULT`]) and
//! `NARAD_SIM_SEED` (the first) control a run, `NARAD_SIM_VERBOSE` prints
//! each seed's report and `NARAD_SIM_HISTORY=FILE` writes its history (JSON
//! lines, as the contract suites write theirs); a failure prints the seed and
//! how to replay it: `NARAD_SIM_SEED=<seed> NARAD_SIM_ITERATIONS=1 cargo
//! test -p narad-broker --test simulation`.

mod sim;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_channel::oneshot;
use narad_broker::partitioner::partition_for_key;
use narad_broker::rpc::{Available, CallError, SettleOutcome};
use narad_broker::shard::Incoming;
use narad_check::{
    check, Delivery, Event, NemesisAction, Op, Outcome, SettleAction as CheckAction, Strictness,
};
use narad_net::types::{
    ChildKindName, ChildRequest, ConsumeRequest, ConsumedMessage, SettleAction, TopicPatch,
};
use narad_net::ApiError;
use narad_raft::state::{Applied, Command, MovePlan, MoveState, NodeId};
use narad_storage::io::sim::{FaultError, FaultOp, FaultRule};
use narad_storage::rng::{SimRng, SimSeeds};

use sim::cluster::{Network, SimCluster, SimShard, StandIn, SHARDS};
use sim::executor::{Executor, Group};

const ITERATIONS_DEFAULT: u64 = 600;
const NODES: u64 = 3;
const TOPIC: &str = "orders";
/// The dead-letter topic of the dead-letter scenario, and its limit.
const DEAD_TOPIC: &str = "orders-dead";
const MAX_DELIVERIES: u32 = 3;
/// The children of the children scenario: a fanout and a delay child.
const CHILDREN: [(&str, Option<u64>); 2] = [("orders-copy", None), ("orders-later", Some(1_500))];
const PARTITIONS: u32 = 4;
const VISIBILITY_MS: u64 = 2_000;
/// How long the clients and the nemesis run (simulated ms).
const CHURN_MS: u64 = 20_000;
/// How long, after the faults end, every accepted message has to be acked.
const SETTLE_MS: u64 = 120_000;
/// A client gives up on a request after this long.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The run's seeds: `NARAD_SIM_SEED` and `NARAD_SIM_ITERATIONS`, else these.
fn seeds() -> SimSeeds {
    SimSeeds::from_env(0xC1A5_0000, ITERATIONS_DEFAULT)
}

/// What replays a failure of `test` at one seed (after the seed's variables).
fn replay(test: &str) -> String {
    format!("cargo test -p narad-broker --test simulation {test}")
}

type Local<T> = Pin<Box<dyn Future<Output = T>>>;

/// What a run exercises.
struct Scenario {
    /// Produces carry a key (so the checker knows each message's partition).
    keyed: bool,
    /// Nodes lose their volumes, and nothing is rerouted (a message stays in
    /// its key's partition, so what a lost volume took is known).
    wipes: bool,
    /// Disks fill up among the other faults.
    full_disks: bool,
    /// The topic has `max_deliveries` and a dead-letter topic, and consumers
    /// nack half of what they get while the faults run.
    dead_letters: bool,
    /// The topic has a fanout and a delay child, read by a client of
    /// their own: each must get every message, the delay child none early.
    children: bool,
    /// Partitions move between nodes among the faults; their sources and
    /// destinations crash mid-move.
    moves: bool,
    /// Every disk is slow, producers send often and consumers poll without
    /// waiting, and the only fault is a power cut: cuts land while a
    /// flush is under way and a consumer looks, so a message made
    /// consumable before its copy was durable is seen, lost, and its
    /// offset given to another.
    mid_flush: bool,
    /// Producers give every message an idempotency key, and send it again
    /// with the same key (and value) when its answer was lost, refused as
    /// retryable or abandoned, to the same node or (half the time) another:
    /// the node, or else the partition's owner, must store it once, so a
    /// value delivered under two ids from one partition is a finding.
    retries: bool,
}

/// Attempts at most per message when producers retry.
const PRODUCE_ATTEMPTS_MAX: u32 = 4;

const CHURN: Scenario = Scenario {
    retries: true,
    keyed: false,
    wipes: false,
    full_disks: false,
    dead_letters: false,
    children: false,
    moves: false,
    mid_flush: false,
};

/// Producers of the mid-flush scenario.
const MID_FLUSH_PRODUCERS: usize = 8;

const MID_FLUSH: Scenario = Scenario {
    mid_flush: true,
    ..CHURN
};

const MOVES_SCENARIO: Scenario = Scenario {
    moves: true,
    children: true,
    ..CHURN
};

const CHILDREN_SCENARIO: Scenario = Scenario {
    children: true,
    ..CHURN
};

const LOST_VOLUMES: Scenario = Scenario {
    keyed: true,
    wipes: true,
    // A lost volume loses the keys it held with its messages.
    retries: false,
    ..CHURN
};

const FULL_DISKS: Scenario = Scenario {
    full_disks: true,
    ..CHURN
};

const DEAD_LETTERS: Scenario = Scenario {
    dead_letters: true,
    ..CHURN
};

/// What clients share: the network (to find running nodes), the history,
/// and what they saw.
struct Clients {
    network: Rc<Network>,
    executor: Rc<Executor>,
    group: Group,
    rng: RefCell<SimRng>,
    events: RefCell<Vec<Event>>,
    next_value: Cell<u64>,
    accepted: RefCell<BTreeSet<String>>,
    acked: RefCell<BTreeSet<String>>,
    /// Ids whose ack got no answer: it may have landed.
    maybe_acked: RefCell<BTreeSet<String>>,
    /// Set once the faults end: consumers then ack everything.
    calm: Cell<bool>,
    keyed: bool,
    retries: bool,
    dead_letters: bool,
    children: bool,
    /// Producers send every few ms and consumers poll without waiting.
    eager: bool,
    /// Ids delivered on the dead-letter topic.
    dead_lettered: RefCell<BTreeSet<String>>,
    /// Deliveries on the topic beyond its `max_deliveries`.
    over_delivered: RefCell<Vec<String>>,
    /// A message is its value (a retry at another node is answered with
    /// a new id, and the owner keeps one copy, under either id): the values
    /// answered 202, those acked (or maybe acked, or dead-lettered) under
    /// some id, and those delivered in each child.
    accepted_values: RefCell<HashSet<String>>,
    settled_values: RefCell<HashSet<String>>,
    /// Ids delivered on the topic: each copy stored is acked in the end,
    /// a retry's copy rerouted to a sibling partition too.
    delivered_ids: RefCell<HashSet<String>>,
    child_values: RefCell<std::collections::BTreeMap<&'static str, HashSet<String>>>,
    stop: Cell<bool>,
}

fn value_of(message: &ConsumedMessage) -> String {
    String::from_utf8_lossy(&message.value).into_owned()
}

/// A consume of `topic` at `node`.
async fn consume_at(
    clients: &Rc<Clients>,
    node: NodeId,
    topic: &'static str,
    request: ConsumeRequest,
    abandon: Option<Duration>,
) -> Answer<Result<Vec<ConsumedMessage>, ApiError>> {
    let consume = move |shard: Rc<SimShard>| -> Local<_> {
        Box::pin(async move {
            let topic = shard.topic(topic)?;
            shard.consume(&topic, request).await
        })
    };
    clients.request(node, consume, abandon).await
}

/// How a request to a node ended, as a client sees it.
enum Answer<T> {
    Done(T),
    /// No answer: the node died, the connection broke, or the client gave up.
    Broken(String),
}

impl Clients {
    fn now(&self) -> u64 {
        self.executor.now_ms()
    }

    fn below(&self, bound: u64) -> u64 {
        self.rng.borrow_mut().below(bound)
    }

    fn chance(&self, numerator: u64, denominator: u64) -> bool {
        self.rng.borrow_mut().chance(numerator, denominator)
    }

    fn record(&self, client: &str, start_ms: u64, op: Op) {
        if let Op::Produce {
            value,
            outcome: Outcome::Ok { .. },
            ..
        } = &op
        {
            self.accepted_values.borrow_mut().insert(value.clone());
        }
        self.events.borrow_mut().push(Event {
            start_ms,
            end_ms: self.now(),
            client: client.to_string(),
            op,
        });
    }

    /// A running node, picked at random.
    fn pick_node(&self) -> Option<NodeId> {
        let nodes: Vec<NodeId> = (1..=NODES)
            .filter(|n| self.network.target(*n).is_some())
            .collect();
        (!nodes.is_empty()).then(|| nodes[self.below(nodes.len() as u64) as usize])
    }

    /// Sends a request to a shard of `node`. Its handler runs as the node's
    /// task (a crash drops it, as a dying process would), and the client's
    /// going away drops it too, as hyper does. With `abandon`, the client
    /// hangs up after that long.
    async fn request<T: 'static>(
        self: &Rc<Self>,
        node: NodeId,
        make: impl FnOnce(Rc<SimShard>) -> Local<T> + 'static,
        abandon: Option<Duration>,
    ) -> Answer<T> {
        let Some((group, shards)) = self.network.target(node) else {
            return Answer::Broken("connection refused".into());
        };
        let shard = shards[self.below(SHARDS as u64) as usize].clone();
        let (done, answer) = oneshot::channel();
        let (hang_up, hung_up) = oneshot::channel::<()>();
        self.executor.spawn(
            group,
            Box::pin(async move {
                let work = async { Some(make(shard).await) };
                let gone = async {
                    let _ = hung_up.await;
                    None
                };
                if let Some(value) = futures_lite::future::or(work, gone).await {
                    let _ = done.send(value);
                }
            }),
        );
        let limit = abandon.unwrap_or(CLIENT_TIMEOUT);
        let waited = futures_lite::future::or(async { Some(answer.await) }, async {
            self.executor.sleep(limit).await;
            None
        })
        .await;
        drop(hang_up);
        match waited {
            Some(Ok(value)) => Answer::Done(value),
            Some(Err(_)) => Answer::Broken("connection reset".into()),
            None => Answer::Broken("no answer in time".into()),
        }
    }
}

fn refused<T>(error: &ApiError) -> Outcome<T> {
    Outcome::Refused {
        status: error.code.status(),
        code: error.code.as_str().to_string(),
    }
}

fn delivery(topic: &str, message: &ConsumedMessage) -> Delivery {
    Delivery {
        id: format!("{:032x}", message.id),
        topic: topic.to_string(),
        partition: message.partition,
        offset: message.offset,
        value: String::from_utf8_lossy(&message.value).into_owned(),
        delivery_count: message.delivery_count,
        lease_expires_at_ms: message.lease_expires_at_ms,
        receipt: message.receipt.clone(),
    }
}

async fn producer(clients: Rc<Clients>, name: String) {
    let spacing_ms = if clients.eager { 4 } else { 60 };
    while !clients.stop.get() && !clients.calm.get() {
        clients
            .executor
            .sleep(Duration::from_millis(clients.below(spacing_ms)))
            .await;
        let Some(node) = clients.pick_node() else {
            continue;
        };
        let number = clients.next_value.get();
        let value = format!("m{number}");
        clients.next_value.set(number + 1);
        let key = clients
            .keyed
            .then(|| format!("k{}", clients.below(64)).into_bytes());
        let idempotency_key = clients.retries.then(|| format!("i{number}").into_bytes());
        let mut node = node;
        for attempt in 1..=PRODUCE_ATTEMPTS_MAX {
            if attempt > 1 && clients.chance(1, 2) {
                node = clients.pick_node().unwrap_or(node);
            }
            let settled = produce_once(
                &clients,
                &name,
                node,
                &value,
                key.clone(),
                idempotency_key.clone(),
            )
            .await;
            if settled
                || idempotency_key.is_none()
                || attempt == PRODUCE_ATTEMPTS_MAX
                || clients.stop.get()
                || clients.calm.get()
            {
                break;
            }
            clients
                .executor
                .sleep(Duration::from_millis(clients.below(400)))
                .await;
        }
    }
}

/// One attempt at producing `value` at `node`, recorded in the history;
/// whether it is settled (answered, or refused for good).
async fn produce_once(
    clients: &Rc<Clients>,
    name: &str,
    node: NodeId,
    value: &str,
    key: Option<Vec<u8>>,
    idempotency_key: Option<Vec<u8>>,
) -> bool {
    let abandon = clients
        .chance(1, 40)
        .then(|| Duration::from_millis(clients.below(20)));
    let start = clients.now();
    let body = Bytes::from(value.to_string());
    let partition = key.as_deref().map(|key| partition_for_key(key, PARTITIONS));
    let answer = clients
        .request(
            node,
            move |shard| {
                Box::pin(async move {
                    let topic = shard.topic(TOPIC)?;
                    let message = Incoming {
                        key,
                        value: body,
                        idempotency_key,
                        partition: None,
                    };
                    shard.produce(&topic, vec![message]).await
                })
            },
            abandon,
        )
        .await;
    let value = value.to_string();
    let (op, settled) = match answer {
        Answer::Done(Ok(outcome)) => {
            let id = outcome.ids.into_iter().next().unwrap_or_default();
            clients.accepted.borrow_mut().insert(id.clone());
            let op = Op::Produce {
                topic: TOPIC.into(),
                value,
                partition,
                outcome: Outcome::Ok { value: id },
            };
            (op, true)
        }
        Answer::Done(Err(error)) => {
            let settled = !error.code.retry();
            let op = Op::Produce {
                topic: TOPIC.into(),
                value,
                partition,
                outcome: refused(&error),
            };
            (op, settled)
        }
        Answer::Broken(_) if abandon.is_some() => {
            let op = Op::ProduceAbandoned {
                topic: TOPIC.into(),
                value,
            };
            (op, false)
        }
        Answer::Broken(reason) => {
            let op = Op::Produce {
                topic: TOPIC.into(),
                value,
                partition,
                outcome: Outcome::Unknown { reason },
            };
            (op, false)
        }
    };
    clients.record(name, start, op);
    settled
}

async fn consumer(clients: Rc<Clients>, name: String) {
    while !clients.stop.get() {
        let Some(node) = clients.pick_node() else {
            clients.executor.sleep(Duration::from_millis(50)).await;
            continue;
        };
        let abandon = (!clients.calm.get() && clients.chance(1, 40))
            .then(|| Duration::from_millis(clients.below(50)));
        if clients.eager {
            clients.executor.sleep(Duration::from_millis(1)).await;
        }
        let request = ConsumeRequest {
            max_messages: 1 + clients.below(5) as u32,
            wait_ms: if clients.eager { 0 } else { clients.below(300) },
            visibility_timeout_ms: None,
            partition: None,
        };
        let start = clients.now();
        let answer = consume_at(&clients, node, TOPIC, request, abandon).await;
        let topic = TOPIC.to_string();
        let (op, messages) = match answer {
            Answer::Done(Ok(messages)) => {
                let value = messages.iter().map(|m| delivery(TOPIC, m)).collect();
                let outcome = Outcome::Ok { value };
                (Op::Consume { topic, outcome }, messages)
            }
            Answer::Done(Err(error)) => {
                let outcome = refused(&error);
                (Op::Consume { topic, outcome }, Vec::new())
            }
            Answer::Broken(_) if abandon.is_some() => (Op::ConsumeAbandoned { topic }, Vec::new()),
            Answer::Broken(reason) => {
                let outcome = Outcome::Unknown { reason };
                (Op::Consume { topic, outcome }, Vec::new())
            }
        };
        clients.record(&name, start, op);
        clients
            .delivered_ids
            .borrow_mut()
            .extend(messages.iter().map(|m| format!("{:032x}", m.id)));
        for message in messages {
            if clients.dead_letters && message.delivery_count > MAX_DELIVERIES {
                let over = format!(
                    "{:032x} delivered {} times",
                    message.id, message.delivery_count
                );
                clients.over_delivered.borrow_mut().push(over);
            }
            settle_one(&clients, &name, &message).await;
        }
    }
}

/// Acks most deliveries; while faults run, also nacks, extends, lets some
/// leases lapse and hangs up on some acks.
async fn settle_one(clients: &Rc<Clients>, name: &str, message: &ConsumedMessage) {
    let roll = if clients.calm.get() {
        0
    } else if clients.dead_letters && clients.chance(1, 2) {
        14
    } else {
        clients.below(20)
    };
    let (action, check_action) = match roll {
        0..=13 => (SettleAction::Ack, CheckAction::Ack),
        14 | 15 => (
            SettleAction::Nack {
                delay_ms: clients.below(500),
            },
            CheckAction::Nack,
        ),
        16 => (
            SettleAction::Extend {
                visibility_timeout_ms: VISIBILITY_MS,
            },
            CheckAction::Extend,
        ),
        // The lease lapses.
        17 => return,
        _ => (SettleAction::Ack, CheckAction::Ack),
    };
    let abandon = (roll == 18).then(|| Duration::from_millis(clients.below(10)));
    // Think time, now and then beyond the lease.
    if !clients.calm.get() && clients.chance(1, 30) {
        let ms = VISIBILITY_MS + clients.below(500);
        clients.executor.sleep(Duration::from_millis(ms)).await;
    }
    let Some(node) = clients.pick_node() else {
        return;
    };
    let receipt = message.receipt.clone();
    let start = clients.now();
    let answer = clients
        .request(
            node,
            move |shard| {
                Box::pin(async move {
                    let topic = shard.topic(TOPIC)?;
                    let mut outcomes: Vec<SettleOutcome> =
                        shard.settle(&topic, &[receipt], action).await;
                    outcomes.pop().unwrap_or(Ok(None))
                })
            },
            abandon,
        )
        .await;
    let (id, receipt) = (format!("{:032x}", message.id), message.receipt.clone());
    let outcome = match answer {
        Answer::Done(Ok(lease_end)) => {
            if check_action == CheckAction::Ack {
                clients.acked.borrow_mut().insert(id.clone());
                clients
                    .settled_values
                    .borrow_mut()
                    .insert(value_of(message));
            }
            Outcome::Ok { value: lease_end }
        }
        Answer::Done(Err(error)) => {
            // 502: the owner did not answer; the ack may have landed.
            if check_action == CheckAction::Ack && error.code.status() == 502 {
                clients.maybe_acked.borrow_mut().insert(id.clone());
                clients
                    .settled_values
                    .borrow_mut()
                    .insert(value_of(message));
            }
            refused(&error)
        }
        Answer::Broken(_) if abandon.is_some() => {
            clients.maybe_acked.borrow_mut().insert(id.clone());
            clients
                .settled_values
                .borrow_mut()
                .insert(value_of(message));
            let op = Op::AckAbandoned {
                topic: TOPIC.into(),
                id,
                receipt,
            };
            clients.record(name, start, op);
            return;
        }
        Answer::Broken(reason) => {
            if check_action == CheckAction::Ack {
                clients.maybe_acked.borrow_mut().insert(id.clone());
                clients
                    .settled_values
                    .borrow_mut()
                    .insert(value_of(message));
            }
            Outcome::Unknown { reason }
        }
    };
    let op = Op::Settle {
        action: check_action,
        topic: TOPIC.into(),
        id,
        receipt,
        outcome,
    };
    clients.record(name, start, op);
}

/// Consumes the dead-letter topic and acks what it gets (outside the
/// history: the checker judges the topic the messages were produced to).
/// The ack is a request of its own: a consume whose answer is lost leaves
/// leases that lapse, and the messages come again.
/// Reads `topic` at random nodes and acks all it gets (anywhere: an ack
/// that does not land only brings the message back once its lease lapses);
/// `seen` takes each answer.
async fn reader(
    clients: Rc<Clients>,
    topic: &'static str,
    seen: impl Fn(&Clients, u64, &[ConsumedMessage]),
) {
    while !clients.stop.get() {
        let Some(node) = clients.pick_node() else {
            clients.executor.sleep(Duration::from_millis(50)).await;
            continue;
        };
        let request = ConsumeRequest {
            max_messages: 10,
            wait_ms: 200,
            visibility_timeout_ms: None,
            partition: None,
        };
        let start = clients.now();
        let answer = consume_at(&clients, node, topic, request, None).await;
        let Answer::Done(Ok(got)) = answer else {
            clients.executor.sleep(Duration::from_millis(50)).await;
            continue;
        };
        seen(&clients, start, &got);
        let receipts: Vec<String> = got.iter().map(|m| m.receipt.clone()).collect();
        let Some(node) = clients.pick_node().filter(|_| !receipts.is_empty()) else {
            continue;
        };
        clients
            .request(
                node,
                move |shard| {
                    Box::pin(async move {
                        let topic = shard.topic(topic)?;
                        Ok::<_, ApiError>(shard.settle(&topic, &receipts, SettleAction::Ack).await)
                    })
                },
                None,
            )
            .await;
    }
}

/// The dead-letter topic's reader: notes what was dead-lettered.
async fn dead_letter_reader(clients: Rc<Clients>) {
    reader(clients, DEAD_TOPIC, |clients, _, got| {
        clients
            .dead_lettered
            .borrow_mut()
            .extend(got.iter().map(|m| format!("{:032x}", m.id)));
        clients
            .settled_values
            .borrow_mut()
            .extend(got.iter().map(value_of));
    })
    .await;
}

/// A child's reader: records its consumes for the checker.
async fn child_reader(clients: Rc<Clients>, child: &'static str) {
    reader(clients, child, move |clients, start, got| {
        clients.record(
            &format!("reader-{child}"),
            start,
            Op::Consume {
                topic: child.into(),
                outcome: Outcome::Ok {
                    value: got.iter().map(|m| delivery(child, m)).collect(),
                },
            },
        );
        clients
            .child_values
            .borrow_mut()
            .entry(child)
            .or_default()
            .extend(got.iter().map(value_of));
    })
    .await;
}

/// Creates the children through node 1, before any produce, and records
/// when each existed.
fn create_children(cluster: &SimCluster, clients: &Rc<Clients>) {
    let executor = clients.executor.clone();
    for (child, delay_ms) in CHILDREN {
        let start = clients.now();
        let done: Rc<Cell<bool>> = Rc::default();
        let (shard, finished) = (cluster.shard(1, 0).expect("node 1"), done.clone());
        executor.spawn(
            clients.group,
            Box::pin(async move {
                let kind = match delay_ms {
                    Some(delay_ms) => ChildKindName::Delay { delay_ms },
                    None => ChildKindName::Fanout,
                };
                let request = ChildRequest {
                    kind,
                    topic: TopicPatch {
                        visibility_timeout_ms: Some(VISIBILITY_MS),
                        ..TopicPatch::default()
                    },
                };
                shard
                    .put_child(TOPIC, child, request)
                    .await
                    .expect("a child");
                finished.set(true);
            }),
        );
        assert!(executor.run_until(executor.now_ms() + 10_000, || done.get()));
        clients.record(
            "setup",
            start,
            Op::Child {
                parent: TOPIC.into(),
                child: child.into(),
                delay_ms,
            },
        );
    }
}

/// Plans a move of a random partition of [`TOPIC`] to another node through
/// the stand-in: the move's id, its source and its destination (`None`
/// when the topic is not there or the plan was refused).
fn plan_random_move(
    standin: &StandIn,
    rng: &mut SimRng,
    now_ms: u64,
) -> Option<(String, NodeId, NodeId)> {
    let view = standin.view();
    let topic = view.state.topics.get(TOPIC)?;
    let partition = u32::try_from(rng.below(u64::from(PARTITIONS))).unwrap_or(0);
    let from = topic.owners[partition as usize];
    let to = 1 + (from + rng.below(NODES - 1)) % NODES;
    let plan = Command::PlanMoves {
        moves: vec![MovePlan {
            topic: TOPIC.into(),
            partition,
            from,
            to,
        }],
        decommission: None,
        now_ms,
    };
    let Ok(Applied::MovesPlanned(planned)) = standin.apply(&plan) else {
        return None;
    };
    Some((planned[0].id.clone(), from, to))
}

/// Moves one partition of the topic to another node. A third of the time
/// its source crashes once the handover began, a third its destination
/// crashes mid-copy; each comes back within two seconds. Then waits (a
/// while) for the move to end.
fn move_among_faults(
    cluster: &mut SimCluster,
    clients: &Clients,
    rng: &mut SimRng,
    faults: bool,
) -> Option<MoveState> {
    let executor = cluster.executor.clone();
    let standin = cluster.standin.clone();
    let (id, from, to) = plan_random_move(&standin, rng, executor.now_ms())?;
    let state = {
        let (standin, id) = (standin.clone(), id.clone());
        move || standin.view().state.moves.get(&id).map(|m| m.state)
    };
    let (victim, when) = match if faults { rng.below(3) } else { 0 } {
        0 => (None, MoveState::Done),
        1 => (Some(from), MoveState::Freezing),
        _ => (Some(to), MoveState::Copying),
    };
    if let Some(node) = victim {
        let reached = {
            let state = state.clone();
            executor.run_until(executor.now_ms() + 30_000, move || {
                state().is_none_or(|s| s == when || !s.is_active())
            })
        };
        if reached && state() == Some(when) {
            let power = rng.chance(1, 2);
            let action = if power {
                NemesisAction::PowerCut
            } else {
                NemesisAction::Kill
            };
            nemesis_event(clients, action, node);
            cluster.crash(node, power);
            executor.run_until(executor.now_ms() + 200 + rng.below(1_800), || false);
            cluster.start(node);
            nemesis_event(clients, NemesisAction::Start, node);
        }
    }
    {
        let state = state.clone();
        executor.run_until(executor.now_ms() + 30_000, move || {
            state().is_none_or(|s| !s.is_active())
        });
    }
    state()
}

/// The draws of one decision of the nemesis: a stream of its own for each
/// seed, purpose ("node", "fault", "full disk", ...) and turn. A decision
/// added later draws from a purpose of its own, so it moves none of the
/// others' draws: earlier seeds keep their faults except on the turns the
/// new one takes.
fn stream(seed: u64, purpose: &str, turn: u64) -> SimRng {
    // FNV-1a names the purpose; SplitMix spreads seed and turn.
    let named = purpose.bytes().fold(0xCBF2_9CE4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3)
    });
    let base = SimRng::new(seed ^ named).next_u64();
    SimRng::new(SimRng::new(base.wrapping_add(turn)).next_u64())
}

fn nemesis_event(clients: &Clients, action: NemesisAction, node: NodeId) {
    let now = clients.now();
    clients.record(
        "nemesis",
        now,
        Op::Nemesis {
            action,
            node: format!("n{node}"),
        },
    );
}

/// One way of a link cut or healed, in the history.
fn link_event(clients: &Clients, from: NodeId, to: NodeId, cut: bool) {
    let now = clients.now();
    clients.record(
        "nemesis",
        now,
        Op::Link {
            from: format!("n{from}"),
            to: format!("n{to}"),
            cut,
        },
    );
}

/// Ends a run's tasks when the run ends, also when it fails.
struct Teardown(Rc<Executor>);

impl Drop for Teardown {
    fn drop(&mut self) {
        self.0.shut_down();
    }
}

/// A simulated cluster of [`NODES`] nodes with `overrides`, every node
/// started and the failure detector running; its tasks end when the
/// returned guard goes.
fn running_cluster(seed: u64, overrides: &[(&str, &str)]) -> (SimCluster, Teardown) {
    let mut cluster = SimCluster::new(seed, NODES, overrides);
    let teardown = Teardown(cluster.executor.clone());
    for node in 1..=NODES {
        cluster.start(node);
    }
    cluster.run_failure_detector();
    (cluster, teardown)
}

/// Whether an operation was answered 404 `topic_not_found`.
fn told_missing(op: &Op) -> bool {
    let code = match op {
        Op::Produce {
            outcome: Outcome::Refused { code, .. },
            ..
        }
        | Op::Consume {
            outcome: Outcome::Refused { code, .. },
            ..
        } => code,
        Op::Settle {
            outcome: Outcome::Refused { code, .. },
            ..
        } => code,
        _ => return false,
    };
    code == "topic_not_found"
}

/// One seed: the whole run. Panics with the checker's report on a
/// violation; returns the history.
fn run(seed: u64, scenario: &Scenario) -> Vec<Event> {
    if let Ok(filter) = std::env::var("NARAD_SIM_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let overrides: &[(&str, &str)] = if scenario.wipes {
        &[("dispatcher.reroute_after_ms", "600000")]
    } else {
        &[]
    };
    let (mut cluster, _teardown) = running_cluster(seed, overrides);
    let executor = cluster.executor.clone();
    let clients = Rc::new(Clients {
        network: cluster.network.clone(),
        executor: executor.clone(),
        group: executor.group(),
        rng: RefCell::new(SimRng::new(seed ^ 0xC11E)),
        events: RefCell::default(),
        next_value: Cell::new(0),
        accepted: RefCell::default(),
        acked: RefCell::default(),
        maybe_acked: RefCell::default(),
        calm: Cell::new(false),
        keyed: scenario.keyed,
        retries: scenario.retries,
        dead_letters: scenario.dead_letters,
        children: scenario.children,
        eager: scenario.mid_flush,
        dead_lettered: RefCell::default(),
        over_delivered: RefCell::default(),
        accepted_values: RefCell::default(),
        settled_values: RefCell::default(),
        delivered_ids: RefCell::default(),
        child_values: RefCell::default(),
        stop: Cell::new(false),
    });

    // The topic, created through node 1.
    let created: Rc<Cell<bool>> = Rc::default();
    {
        let (shard, created) = (cluster.shard(1, 0).expect("node 1"), created.clone());
        let mut patch = TopicPatch {
            partitions: Some(PARTITIONS),
            visibility_timeout_ms: Some(VISIBILITY_MS),
            ..TopicPatch::default()
        };
        let dead_letters = scenario.dead_letters;
        if dead_letters {
            patch.max_deliveries = Some(MAX_DELIVERIES);
            patch.dead_letter_topic = Some(Some(DEAD_TOPIC.to_string()));
        }
        executor.spawn(
            clients.group,
            Box::pin(async move {
                if dead_letters {
                    let dead = TopicPatch {
                        partitions: Some(2),
                        visibility_timeout_ms: Some(VISIBILITY_MS),
                        ..TopicPatch::default()
                    };
                    shard
                        .put_topic(DEAD_TOPIC, dead)
                        .await
                        .expect("the dead-letter topic");
                }
                shard.put_topic(TOPIC, patch).await.expect("the topic");
                created.set(true);
            }),
        );
    }
    assert!(executor.run_until(executor.now_ms() + 10_000, || created.get()));
    let owners = cluster.standin.view().state.topics[TOPIC]
        .owners
        .iter()
        .map(|n| format!("n{n}"))
        .collect();
    clients.record(
        "setup",
        executor.now_ms(),
        Op::Owners {
            topic: TOPIC.into(),
            owners,
        },
    );
    if scenario.dead_letters {
        executor.spawn(clients.group, Box::pin(dead_letter_reader(clients.clone())));
    }
    if scenario.children {
        create_children(&cluster, &clients);
        for (child, _) in CHILDREN {
            executor.spawn(
                clients.group,
                Box::pin(child_reader(clients.clone(), child)),
            );
        }
    }
    for i in 0..2 {
        executor.spawn(
            clients.group,
            Box::pin(producer(clients.clone(), format!("producer-{i}"))),
        );
        executor.spawn(
            clients.group,
            Box::pin(consumer(clients.clone(), format!("consumer-{i}"))),
        );
    }
    // Enough producers to keep a flush under way on each node's slow disk.
    if scenario.mid_flush {
        for i in 2..MID_FLUSH_PRODUCERS {
            executor.spawn(
                clients.group,
                Box::pin(producer(clients.clone(), format!("producer-{i}"))),
            );
        }
    }

    // A move with no fault around it hands over.
    if scenario.moves {
        let mut how = stream(seed, "quiet move", 0);
        let ended = move_among_faults(&mut cluster, &clients, &mut how, false);
        assert_eq!(ended, Some(MoveState::Done), "seed {seed}: a quiet move");
    }
    // Faults, one at a time, each healed before the next; each decision of
    // a turn draws from its own stream (`stream`).
    let churn_end = executor.now_ms() + CHURN_MS;
    let mut turn = 0;
    if scenario.mid_flush {
        // Slow disks are outages to the checker (see below).
        for node in 1..=NODES {
            nemesis_event(&clients, NemesisAction::Pause, node);
            cluster.nodes[(node - 1) as usize].latency.slow.set(true);
        }
    }
    while executor.now_ms() < churn_end {
        turn += 1;
        let draw = move |purpose: &str| stream(seed, purpose, turn);
        if scenario.mid_flush {
            let mut cut = draw("mid-flush cut");
            executor.run_until(executor.now_ms() + 100 + cut.below(600), || false);
            let node = 1 + cut.below(NODES);
            nemesis_event(&clients, NemesisAction::PowerCut, node);
            cluster.crash(node, true);
            executor.run_until(executor.now_ms() + 100 + cut.below(400), || false);
            cluster.start(node);
            nemesis_event(&clients, NemesisAction::Start, node);
            continue;
        }
        let quiet = 500 + draw("quiet").below(3_000);
        executor.run_until(executor.now_ms() + quiet, || false);
        let node = 1 + draw("node").below(NODES);
        if scenario.moves && draw("move").chance(1, 2) {
            move_among_faults(&mut cluster, &clients, &mut draw("move how"), true);
            continue;
        }
        if scenario.wipes {
            // Back before the controller would mark it dead (which would
            // send its partitions' records elsewhere).
            let mut wipe = draw("wipe");
            let down_ms = 200 + wipe.below(2_000);
            let action = match wipe.below(3) {
                0 => NemesisAction::Wipe,
                1 => NemesisAction::PowerCut,
                _ => NemesisAction::Kill,
            };
            nemesis_event(&clients, action, node);
            match action {
                NemesisAction::Wipe => cluster.wipe(node),
                action => cluster.crash(node, action == NemesisAction::PowerCut),
            }
            executor.run_until(executor.now_ms() + down_ms, || false);
            cluster.start(node);
            nemesis_event(&clients, NemesisAction::Start, node);
            continue;
        }
        // The disk fills up, on a sixth of the turns (the kinds below share
        // the rest); a while after space is freed (acks held back meanwhile
        // are written then) the operator restarts the node, whose failed
        // WAL stays failed until then.
        let mut full = draw("full disk");
        if scenario.full_disks && full.chance(1, 6) {
            let down_ms = 200 + full.below(4_000);
            let fs = cluster.nodes[(node - 1) as usize].fs.clone();
            nemesis_event(&clients, NemesisAction::Pause, node);
            fs.inject(FaultRule::always(
                FaultOp::Write,
                "/data",
                FaultError::Enospc,
            ));
            executor.run_until(executor.now_ms() + down_ms, || false);
            fs.clear_faults();
            executor.run_until(executor.now_ms() + 1_000, || false);
            nemesis_event(&clients, NemesisAction::Resume, node);
            nemesis_event(&clients, NemesisAction::Kill, node);
            cluster.crash(node, false);
            cluster.start(node);
            nemesis_event(&clients, NemesisAction::Start, node);
            continue;
        }
        let mut fault = draw("fault");
        let down_ms = 200 + fault.below(4_000);
        match fault.below(5) {
            0 | 1 => {
                let power = fault.chance(1, 2);
                let action = if power {
                    NemesisAction::PowerCut
                } else {
                    NemesisAction::Kill
                };
                nemesis_event(&clients, action, node);
                cluster.crash(node, power);
                executor.run_until(executor.now_ms() + down_ms, || false);
                cluster.start(node);
                nemesis_event(&clients, NemesisAction::Start, node);
            }
            // The node cut off both ways, or one way only (its own stream,
            // so that older seeds draw as before): not heard (what it sends
            // is lost) or deaf (what is sent to it is lost).
            2 => match draw("cut way").below(3) {
                0 => {
                    nemesis_event(&clients, NemesisAction::Pause, node);
                    cluster.network.cut.borrow_mut().insert(node);
                    executor.run_until(executor.now_ms() + down_ms, || false);
                    cluster.network.cut.borrow_mut().remove(&node);
                    nemesis_event(&clients, NemesisAction::Resume, node);
                }
                way => {
                    let links: Vec<(NodeId, NodeId)> = (1..=NODES)
                        .filter(|other| *other != node)
                        .map(|other| {
                            if way == 1 {
                                (node, other)
                            } else {
                                (other, node)
                            }
                        })
                        .collect();
                    for &(from, to) in &links {
                        link_event(&clients, from, to, true);
                        cluster.network.one_way.borrow_mut().insert((from, to));
                    }
                    executor.run_until(executor.now_ms() + down_ms, || false);
                    for &(from, to) in &links {
                        cluster.network.one_way.borrow_mut().remove(&(from, to));
                        link_event(&clients, from, to, false);
                    }
                }
            },
            // A slow disk and a lossy network are outages to the checker
            // (as a pause is): a commit whose answer came late or got lost
            // is sent again, rerouted, and may be stored twice.
            3 => {
                let latency = cluster.nodes[(node - 1) as usize].latency.clone();
                nemesis_event(&clients, NemesisAction::Pause, node);
                latency.slow.set(true);
                executor.run_until(executor.now_ms() + down_ms, || false);
                latency.slow.set(false);
                nemesis_event(&clients, NemesisAction::Resume, node);
            }
            _ => {
                for node in 1..=NODES {
                    nemesis_event(&clients, NemesisAction::Pause, node);
                }
                cluster.network.loss_per_mille.set(50 + fault.below(200));
                executor.run_until(executor.now_ms() + down_ms, || false);
                cluster.network.loss_per_mille.set(0);
                for node in 1..=NODES {
                    nemesis_event(&clients, NemesisAction::Resume, node);
                }
            }
        }
    }

    if scenario.mid_flush {
        for node in 1..=NODES {
            cluster.nodes[(node - 1) as usize].latency.slow.set(false);
            nemesis_event(&clients, NemesisAction::Resume, node);
        }
    }
    // Calm: every accepted message must be delivered and acked.
    clients.calm.set(true);
    let settled = {
        let clients = clients.clone();
        executor.run_until(executor.now_ms() + SETTLE_MS, move || {
            // By value: each accepted message acked (or dead-lettered)
            // under one of its ids.
            let accepted = clients.accepted_values.borrow();
            let in_children = clients.child_values.borrow();
            let copied = !clients.children
                || CHILDREN.iter().all(|(child, _)| {
                    in_children
                        .get(child)
                        .is_some_and(|seen| accepted.is_subset(seen))
                });
            let (acked, maybe) = (clients.acked.borrow(), clients.maybe_acked.borrow());
            let dead = clients.dead_lettered.borrow();
            let every_copy = clients
                .delivered_ids
                .borrow()
                .iter()
                .all(|id| acked.contains(id) || maybe.contains(id) || dead.contains(id));
            copied && every_copy && accepted.is_subset(&clients.settled_values.borrow())
        })
    };
    // Nothing stays behind in a WAL: every record a shard took in was
    // handed to its owner, those whose client hung up included.
    let handed_on = {
        let network = cluster.network.clone();
        executor.run_until(executor.now_ms() + 10_000, move || {
            (1..=NODES)
                .filter_map(|node| network.target(node))
                .flat_map(|(_, shards)| shards)
                .all(|shard| shard.wal().stats().uncommitted_records == 0)
        })
    };
    clients.stop.set(true);
    // Each handover, when the metastore applied it: it ended the leases of
    // its partition.
    let moves = cluster.standin.view().state.moves.clone();
    for done in moves.values() {
        if let (MoveState::Done, Some(at)) = (done.state, done.finished_at_ms) {
            clients.events.borrow_mut().push(Event {
                start_ms: at,
                end_ms: at,
                client: "metastore".into(),
                op: Op::Handover {
                    topic: done.topic.clone(),
                    partition: done.partition,
                    from: format!("n{}", done.from),
                    to: format!("n{}", done.to),
                },
            });
        }
    }
    let events = clients.events.borrow().clone();
    let faults: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.op {
            Op::Nemesis { action, node } => Some(format!("{} {action:?} {node}", e.start_ms)),
            _ => None,
        })
        .collect();
    if let Some(path) = std::env::var_os("NARAD_SIM_HISTORY") {
        std::fs::write(path, history(&events)).expect("writing the history");
    }
    let report = check(&events);
    let mut violations = report.violations(Strictness::Faults);
    if scenario.dead_letters {
        // A message out of deliveries is settled by its move to the
        // dead-letter topic, not by an ack: `settled` above requires each
        // to be acked there or here instead.
        violations.retain(|(name, _)| *name != "never_acked");
        let unsettled: Vec<String> = {
            let done = clients.settled_values.borrow();
            let mut left: Vec<String> = clients
                .accepted_values
                .borrow()
                .iter()
                .filter(|v| !done.contains(*v))
                .cloned()
                .collect();
            left.sort();
            left.truncate(5);
            left
        };
        let seen: Vec<String> = events
            .iter()
            .filter_map(|e| match &e.op {
                Op::Consume {
                    outcome: Outcome::Ok { value },
                    ..
                } => Some((e.end_ms, value)),
                _ => None,
            })
            .flat_map(|(at, value)| value.iter().map(move |d| (at, d)))
            .filter(|(_, d)| unsettled.contains(&d.value))
            .map(|(at, d)| {
                format!(
                    "{} at {at} p{} o{} count {}",
                    d.id, d.partition, d.offset, d.delivery_count
                )
            })
            .collect();
        assert!(
            settled,
            "seed {seed}: neither acked nor dead-lettered: {unsettled:?}; their deliveries: \
             {seen:?}\nfaults: {}",
            faults.join(", ")
        );
        let over = clients.over_delivered.borrow();
        assert!(
            over.is_empty(),
            "seed {seed}: delivered beyond max_deliveries {MAX_DELIVERIES}: {over:?}"
        );
    }
    assert!(
        violations.is_empty(),
        "seed {seed}: {violations:?} (every accepted message acked in time: {settled})\n{}\nfaults: {}",
        report.summary(),
        faults.join(", ")
    );
    assert!(report.accepted > 0, "seed {seed}: nothing was accepted");
    assert!(
        handed_on,
        "seed {seed}: records left in a WAL, never handed to their owner"
    );
    // The topic is never deleted: a node still learning the metadata says
    // "retry" (503 catching_up), never "no such topic" (a final 404).
    let said_missing: Vec<&Event> = events.iter().filter(|e| told_missing(&e.op)).collect();
    assert!(
        said_missing.is_empty(),
        "seed {seed}: {} answers said the topic does not exist, e.g. {:?}",
        said_missing.len(),
        said_missing.first()
    );
    if std::env::var_os("NARAD_SIM_VERBOSE").is_some() {
        eprintln!(
            "seed {seed}: {} ({} executor steps)",
            report.summary(),
            executor.steps()
        );
    }
    events
}

/// A history as `NARAD_SIM_HISTORY` writes it: one JSON line per event.
fn history(events: &[Event]) -> String {
    let lines: Vec<String> = events
        .iter()
        .map(|e| serde_json::to_string(e).expect("an event as JSON"))
        .collect();
    lines.join("\n")
}

#[test]
fn another_nodes_availability_notice_is_answered() {
    let mut cluster = SimCluster::new(seeds().first, NODES, &[]);
    let _teardown = Teardown(cluster.executor.clone());
    for node in 1..=NODES {
        cluster.start(node);
    }
    let answer: Rc<RefCell<Option<Result<(), CallError>>>> = Rc::default();
    let cluster = Rc::new(cluster);
    let (caller, got) = (cluster.clone(), answer.clone());
    let executor = cluster.executor.clone();
    executor.spawn(
        executor.group(),
        Box::pin(async move {
            let reply = caller.call_node(1, 2, Available { from: 1 }).await;
            *got.borrow_mut() = Some(reply);
        }),
    );
    assert!(executor.run_until(executor.now_ms() + 5_000, || answer.borrow().is_some()));
    assert_eq!(answer.borrow_mut().take(), Some(Ok(())));
}

/// Runs `scenario` for `count` seeds of the run; reports the first that fails.
fn for_each_seed(test: &str, scenario: &Scenario, count: u64) {
    seeds().run(count, &replay(test), |seed| drop(run(seed, scenario)));
}

/// Runs `scenario` at `seed`; a failure names the command that replays it.
fn run_seed(test: &str, scenario: &Scenario, seed: u64) {
    narad_storage::rng::run_seed(seed, &replay(test), |seed| drop(run(seed, scenario)));
}

/// A seed replays alone: nothing of its run depends on what ran before it
/// in the process (maps created since hash with other keys), so the
/// command a failure prints replays that very run. The first seed of the
/// moves scenario (children, moves and faults) runs, then the next seed,
/// then the first again: the two histories must match byte for byte.
#[test]
fn a_seed_gives_the_same_history_when_run_again_after_another() {
    let seed = seeds().first;
    let first = history(&run(seed, &MOVES_SCENARIO));
    run(seed + 1, &MOVES_SCENARIO);
    let again = history(&run(seed, &MOVES_SCENARIO));
    if first != again {
        let (line, was, now) = first_difference(&first, &again);
        panic!("seed {seed}: run again, its history differs first at line {line}:\n  first: {was}\n  again: {now}");
    }
}

/// The first line (counted from 1) where two histories differ, and that
/// line of each (`(none)` past the end of one).
fn first_difference<'a>(first: &'a str, again: &'a str) -> (usize, &'a str, &'a str) {
    let (mut was, mut now) = (first.lines(), again.lines());
    for line in 1.. {
        match (was.next(), now.next()) {
            (Some(a), Some(b)) if a == b => continue,
            (None, None) => break,
            (a, b) => return (line, a.unwrap_or("(none)"), b.unwrap_or("(none)")),
        }
    }
    (0, "", "")
}

#[test]
fn a_simulated_cluster_keeps_the_delivery_contract_under_faults() {
    for_each_seed(
        "a_simulated_cluster_keeps_the_delivery_contract_under_faults",
        &CHURN,
        seeds().iterations,
    );
}

/// Full disks among the other faults: an ack answered 204 just as the disk
/// filled (before its partition's next write found no space) is held back
/// and written once space returns, so the restart that follows does not
/// deliver it again (it did, at seed 3248816134, before the ack log held
/// acks back on ENOSPC). A quarter of the seeds.
#[test]
fn a_full_disk_loses_no_acked_message() {
    for_each_seed(
        "a_full_disk_loses_no_acked_message",
        &FULL_DISKS,
        seeds().iterations.div_ceil(4),
    );
}

/// Dead letters under the same faults: no message delivered more than
/// `max_deliveries` times on one lease count, and every message acked or
/// moved to the dead-letter topic. A quarter of the seeds.
#[test]
fn a_simulated_cluster_dead_letters_on_time_under_faults() {
    for_each_seed(
        "a_simulated_cluster_dead_letters_on_time_under_faults",
        &DEAD_LETTERS,
        seeds().iterations.div_ceil(4),
    );
}

/// Power cuts while flushes are under way on slow disks and consumers
/// poll without waiting: a message is consumable only once its copy is
/// durable and read back, so no offset a consumer saw is given to another
/// message after a cut. An eighth of the seeds.
#[test]
fn nothing_seen_before_its_flush_is_durable_is_lost_at_a_power_cut() {
    for_each_seed(
        "nothing_seen_before_its_flush_is_durable_is_lost_at_a_power_cut",
        &MID_FLUSH,
        seeds().iterations.div_ceil(8),
    );
}

/// A partition's first open on a node was dropped by its request after it
/// created the ack files and before it synced their folder; the next open
/// took the files as they were, and a power cut 16 s later took with their
/// names every ack synced into them since (70 acked messages delivered
/// again at this seed, before an open made the files it adopts durable).
#[test]
fn acks_of_a_partition_whose_first_open_was_dropped_survive_a_power_cut() {
    run_seed(
        "acks_of_a_partition_whose_first_open_was_dropped_survive_a_power_cut",
        &DEAD_LETTERS,
        7_900_226,
    );
}

/// Children under the same faults: a fanout and a delay child get every
/// message the topic accepted, the delay child none before its delay.
/// An eighth of the seeds.
#[test]
fn a_simulated_clusters_children_get_every_message_under_faults() {
    for_each_seed(
        "a_simulated_clusters_children_get_every_message_under_faults",
        &CHILDREN_SCENARIO,
        seeds().iterations.div_ceil(8),
    );
}

/// Partitions move among the faults, their sources crashing during the
/// handover and their destinations mid-copy: nothing accepted is lost,
/// nothing acked comes back, and the children (whose cursors move with
/// the partitions) get every message. An eighth of the seeds.
#[test]
fn a_simulated_cluster_moves_partitions_under_faults_and_loses_nothing() {
    for_each_seed(
        "a_simulated_cluster_moves_partitions_under_faults_and_loses_nothing",
        &MOVES_SCENARIO,
        seeds().iterations.div_ceil(8),
    );
}

/// A quarter of the seeds: each run is as long, and the churn above covers
/// the other faults.
#[test]
fn a_simulated_cluster_loses_only_what_a_lost_volume_held() {
    for_each_seed(
        "a_simulated_cluster_loses_only_what_a_lost_volume_held",
        &LOST_VOLUMES,
        seeds().iterations.div_ceil(4),
    );
}

/// `cluster.move_promote_after_ms` in the promotion test: short, so that a
/// seed takes a few simulated seconds.
const PROMOTE_AFTER_MS: u64 = 5_000;
/// How many seeds the promotion test runs.
const PROMOTION_SEEDS: u64 = 40;
/// How late, on the simulated clock, the controller may mark a silent node
/// dead and a destination may take over: a heartbeat interval for the
/// detector's look, and the destination's promotion check with a few hops.
const DETECTOR_SLACK_MS: u64 = 400;
const PROMOTION_SLACK_MS: u64 = 500;

/// The contract's clocks, with the real failure detector and the real move
/// code on the simulated clock: a move's source dies (SIGKILL or power cut,
/// and stays down) just after the move was planned; the controller marks
/// it dead `cluster.node_dead_after_ms` after its last heartbeat, and the
/// destination promotes its copy `cluster.move_promote_after_ms` after the
/// source's death, not after it was marked dead (items seen in process
/// tests too; here over many seeds and on an exact clock).
#[test]
fn a_move_whose_source_dies_is_promoted_on_the_contracts_clock() {
    let promote_after = PROMOTE_AFTER_MS.to_string();
    seeds().run(
        PROMOTION_SEEDS,
        &replay("a_move_whose_source_dies_is_promoted_on_the_contracts_clock"),
        |seed| {
            let (mut cluster, _teardown) = running_cluster(
                seed,
                &[("cluster.move_promote_after_ms", promote_after.as_str())],
            );
            let executor = cluster.executor.clone();
            let standin = cluster.standin.clone();
            create_plain_topic(&cluster);
            let mut rng = SimRng::new(seed);
            let Some((id, from, _)) = plan_random_move(&standin, &mut rng, executor.now_ms())
            else {
                panic!("seed {seed}: the move was not planned");
            };
            let died_at = executor.now_ms();
            cluster.crash(from, rng.chance(1, 2));
            let marked_dead = {
                let standin = standin.clone();
                move || {
                    standin
                        .view()
                        .state
                        .nodes
                        .get(&from)
                        .is_some_and(|n| !n.alive)
                }
            };
            let dead_after = cluster.settings.cluster.node_dead_after_ms;
            assert!(
            executor.run_until(died_at + dead_after + DETECTOR_SLACK_MS, marked_dead),
            "seed {seed}: node {from} marked dead within {dead_after} ms (+{DETECTOR_SLACK_MS}) \
             of its death"
        );
            let ended = {
                let (standin, id) = (standin.clone(), id.clone());
                move || {
                    standin
                        .view()
                        .state
                        .moves
                        .get(&id)
                        .is_none_or(|m| !m.state.is_active())
                }
            };
            assert!(
                executor.run_until(died_at + PROMOTE_AFTER_MS + PROMOTION_SLACK_MS, ended),
                "seed {seed}: the move from node {from} ended within {PROMOTE_AFTER_MS} ms \
             (+{PROMOTION_SLACK_MS}) of its source's death (now {} ms after it)",
                executor.now_ms() - died_at
            );
            let ended_after = executor.now_ms() - died_at;
            let state = standin.view().state.moves.get(&id).map(|m| m.state);
            assert_eq!(
                state,
                Some(MoveState::Promoted),
                "seed {seed}: the destination promoted its copy"
            );
            // Not before: the source's last heartbeat came at most one interval
            // before its death.
            let interval = cluster.settings.cluster.heartbeat_interval_ms;
            assert!(
                ended_after + interval >= PROMOTE_AFTER_MS,
                "seed {seed}: promoted {ended_after} ms after the source died, before \
             {PROMOTE_AFTER_MS} ms"
            );
        },
    );
}

/// Creates [`TOPIC`] with [`PARTITIONS`] partitions through node 1, and
/// waits for it.
fn create_plain_topic(cluster: &SimCluster) {
    let executor = cluster.executor.clone();
    let created: Rc<Cell<bool>> = Rc::default();
    let (shard, done) = (cluster.shard(1, 0).expect("node 1"), created.clone());
    let patch = TopicPatch {
        partitions: Some(PARTITIONS),
        ..TopicPatch::default()
    };
    executor.spawn(
        executor.group(),
        Box::pin(async move {
            shard.put_topic(TOPIC, patch).await.expect("the topic");
            done.set(true);
        }),
    );
    assert!(executor.run_until(executor.now_ms() + 10_000, || created.get()));
}

/// How many seeds the reroute test runs, and how long its cut lasts.
const REROUTE_SEEDS: u64 = 30;
const REROUTE_CUT_MS: u64 = 8_000;
/// On top of `dispatcher.reroute_after_ms`: the linger, a commit to the
/// sibling, and a sample's spacing.
const REROUTE_SLACK_MS: u64 = 1_000;
/// Once the reroute is under way a record is handed on within this.
const REROUTED_AT_ONCE_MS: u64 = 1_000;
/// How often the reroute test samples every WAL.
const WAL_SAMPLE_MS: u64 = 50;

/// The reroute's clock, with the real dispatcher on the simulated clock:
/// every node takes unkeyed produces while one is cut off from the others,
/// both ways. No record may wait in any node's WAL (the one cut off
/// included: its records go to its own partitions) longer than
/// `dispatcher.reroute_after_ms` (+[`REROUTE_SLACK_MS`]) before an owner
/// took it, and once the reroute is under way no longer than
/// [`REROUTED_AT_ONCE_MS`]. Measured on each WAL: its oldest record not yet
/// taken (`tail`) must have passed where its durable data ended that long
/// before.
#[test]
fn a_cut_off_owners_records_go_to_a_sibling_on_the_contracts_clock() {
    let reroute_after = sim::cluster::settings(&[]).dispatcher.reroute_after_ms;
    let mut longest = 0;
    seeds().run(
        REROUTE_SEEDS,
        &replay("a_cut_off_owners_records_go_to_a_sibling_on_the_contracts_clock"),
        |seed| {
            // The production setting: the cut ends long before the node would
            // be marked dead, so the reroute comes from failing commits alone.
            let (cluster, _teardown) =
                running_cluster(seed, &[("cluster.node_dead_after_ms", "30000")]);
            let executor = cluster.executor.clone();
            create_plain_topic(&cluster);
            // A produce every 10 ms at every node, and a sample of every WAL.
            type Samples = RefCell<BTreeMap<(NodeId, usize), Vec<(u64, u64, u64)>>>;
            let samples: Rc<Samples> = Rc::default();
            {
                let (network, executor_in) = (cluster.network.clone(), executor.clone());
                let samples = samples.clone();
                executor.spawn(
                    executor.group(),
                    Box::pin(async move {
                        let mut turn = 0u64;
                        loop {
                            executor_in.sleep(Duration::from_millis(10)).await;
                            turn += 1;
                            for node in 1..=NODES {
                                let Some((group, shards)) = network.target(node) else {
                                    continue;
                                };
                                let shard = shards[(turn % shards.len() as u64) as usize].clone();
                                let body = Bytes::from(format!("n{node}-{turn}"));
                                executor_in.spawn(
                                    group,
                                    Box::pin(async move {
                                        if let Ok(topic) = shard.topic(TOPIC) {
                                            let _ = shard
                                                .produce(&topic, vec![Incoming::value(body)])
                                                .await;
                                        }
                                    }),
                                );
                            }
                            if turn % (WAL_SAMPLE_MS / 10) == 0 {
                                let now = executor_in.now_ms();
                                for node in 1..=NODES {
                                    let Some((_, shards)) = network.target(node) else {
                                        continue;
                                    };
                                    for (i, shard) in shards.iter().enumerate() {
                                        let wal = shard.wal().stats();
                                        samples.borrow_mut().entry((node, i)).or_default().push((
                                            now,
                                            wal.durable_end,
                                            wal.tail,
                                        ));
                                    }
                                }
                            }
                        }
                    }),
                );
            }
            executor.run_until(executor.now_ms() + 2_000, || false);
            let victim = 1 + SimRng::new(seed).below(NODES);
            let cut_at = executor.now_ms();
            cluster.network.cut.borrow_mut().insert(victim);
            executor.run_until(cut_at + REROUTE_CUT_MS, || false);
            cluster.network.cut.borrow_mut().remove(&victim);
            let first_bound = reroute_after + REROUTE_SLACK_MS;
            for ((node, shard), series) in samples.borrow().iter() {
                for &(at, _, tail) in series
                    .iter()
                    .filter(|s| s.0 >= cut_at && s.0 <= cut_at + REROUTE_CUT_MS)
                {
                    let bound = if at >= cut_at + 2 * first_bound {
                        REROUTED_AT_ONCE_MS
                    } else {
                        first_bound
                    };
                    // Where the durable data ended `bound` before this sample.
                    let Some(&(_, then_end, _)) = series.iter().rev().find(|s| s.0 + bound <= at)
                    else {
                        continue;
                    };
                    // How long the oldest record still waiting has waited.
                    let waited = series
                        .iter()
                        .find(|s| s.1 > tail)
                        .map_or(0, |s| at.saturating_sub(s.0));
                    longest = longest.max(waited);
                    assert!(
                    tail >= then_end,
                    "seed {seed}: {} ms into the cut of node {victim}, node {node} shard {shard} \
                     still holds a record that was durable {bound} ms before (it waited about \
                     {waited} ms); replay with NARAD_SIM_SEED={seed}",
                    at - cut_at
                );
                }
            }
        },
    );
    eprintln!("the longest a record waited in a WAL during a cut: about {longest} ms");
}

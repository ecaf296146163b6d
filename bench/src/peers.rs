//! In-process clients of the peer brokers, behind the same [`Driver`] trait,
//! rate controller and histograms as Narad (never a peer's own benchmark
//! tool). Built with `--features peers`; `bench/peers.sh` installs and
//! starts the servers on the addresses below, each set to confirm a producer
//! only after an fsync, and each driver reads that setting back.
//!
//! - NATS JetStream: a work-queue stream on file storage per topic, a
//!   durable pull consumer with explicit acks (AckWait is the visibility
//!   timeout), publish acks awaited one at a time.
//! - RabbitMQ: a quorum queue per topic, publisher confirms awaited one at a
//!   time, manual acks (several at once with `multiple`).
//! - Redis streams: one stream per topic with `appendfsync always`, a
//!   consumer group, `XREADGROUP` and `XACK`. `redis-pipelined` shares a
//!   few connections among all producers and pipelines the `XADD`s that
//!   came while the last pipeline was out (one in flight per connection),
//!   as `narad-coalescing` batches.
//!
//! Partitions: each peer keeps a topic as one stream or queue (NATS and Redis
//! streams are one log; a quorum queue is one Raft group), as OMB's drivers
//! for them do.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use crate::compare::SystemArgs;
use crate::driver::{Consumer, Driver, Producer};

const NATS_MONITOR: &str = "127.0.0.1:18222";
const RABBITMQ_NODE: &str = "narad-bench@localhost";
const GROUP: &str = "bench";
/// How long a peer keeps a delivered, unacked message before giving it to
/// another consumer (Narad's default visibility timeout).
const VISIBILITY: Duration = Duration::from_secs(30);
/// Unacked messages a RabbitMQ consumer may hold.
const RABBITMQ_PREFETCH: u16 = 500;

static CONSUMER_IDS: AtomicU64 = AtomicU64::new(0);

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// The driver for a peer, if its server answers (at the address
/// `--nats`, `--rabbitmq` or `--redis` gives).
pub fn driver(name: &str, system: &SystemArgs) -> Result<Arc<dyn Driver>, String> {
    match name {
        "nats" => Ok(Arc::new(Nats::connect(&system.nats)?)),
        "rabbitmq" => Ok(Arc::new(RabbitMq::connect(&system.rabbitmq)?)),
        "redis" => Ok(Arc::new(Redis::connect(&system.redis)?)),
        "redis-pipelined" => Ok(Arc::new(RedisPipelined::connect(&system.redis)?)),
        other => Err(format!(
            "unknown system {other:?} (narad, nats, rabbitmq, redis, redis-pipelined)"
        )),
    }
}

// ------------------------------------------------------------------ NATS

/// NATS JetStream through `async-nats` on a small tokio runtime that every
/// producer and consumer thread blocks on.
struct Nats {
    runtime: Arc<tokio::runtime::Runtime>,
    jetstream: async_nats::jetstream::Context,
}

impl Nats {
    fn connect(url: &str) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(text)?;
        let client = runtime
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(2), async_nats::connect(url)).await
            })
            .map_err(|_| format!("nats: no answer from {url}"))?
            .map_err(text)?;
        Ok(Self {
            runtime: Arc::new(runtime),
            jetstream: async_nats::jetstream::new(client),
        })
    }
}

/// `GET http://ADDR/PATH` of a monitoring endpoint, as JSON (HTTP/1.0: no
/// chunked answer).
fn http_json(addr: &str, path: &str) -> Result<Value, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(text)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(text)?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .ok_or("no body")?;
    serde_json::from_str(body).map_err(text)
}

impl Driver for Nats {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn durability(&self) -> Result<String, String> {
        let varz = http_json(NATS_MONITOR, "/varz")?;
        let config = &varz["jetstream"]["config"];
        Ok(format!(
            "nats-server {}: jetstream sync_always={} (sync_interval: always), file storage",
            varz["version"].as_str().unwrap_or("?"),
            config["sync_always"].as_bool().unwrap_or(false)
        ))
    }

    fn create_topic(&self, topic: &str, _partitions: u32) -> Result<(), String> {
        use async_nats::jetstream::{consumer, stream};
        self.runtime.block_on(async {
            let stream = self
                .jetstream
                .create_stream(stream::Config {
                    name: topic.to_string(),
                    subjects: vec![topic.to_string()],
                    retention: stream::RetentionPolicy::WorkQueue,
                    storage: stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .map_err(text)?;
            stream
                .create_consumer(consumer::pull::Config {
                    durable_name: Some(GROUP.into()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: VISIBILITY,
                    max_ack_pending: 100_000,
                    ..Default::default()
                })
                .await
                .map_err(text)?;
            Ok(())
        })
    }

    fn delete_topic(&self, topic: &str) -> Result<(), String> {
        self.runtime
            .block_on(self.jetstream.delete_stream(topic))
            .map(|_| ())
            .map_err(text)
    }

    fn producer(&self, topic: &str) -> Result<Box<dyn Producer>, String> {
        Ok(Box::new(NatsProducer {
            runtime: self.runtime.clone(),
            jetstream: self.jetstream.clone(),
            subject: topic.to_string(),
        }))
    }

    fn consumer(&self, topic: &str) -> Result<Box<dyn Consumer>, String> {
        let consumer = self.runtime.block_on(async {
            let stream = self.jetstream.get_stream(topic).await.map_err(text)?;
            stream
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(GROUP)
                .await
                .map_err(text)
        })?;
        Ok(Box::new(NatsConsumer {
            runtime: self.runtime.clone(),
            consumer,
            unacked: Vec::new(),
        }))
    }
}

struct NatsProducer {
    runtime: Arc<tokio::runtime::Runtime>,
    jetstream: async_nats::jetstream::Context,
    subject: String,
}

impl Producer for NatsProducer {
    fn send(&mut self, _key: Option<&str>, payload: &[u8]) -> Result<(), String> {
        let payload = bytes::Bytes::copy_from_slice(payload);
        self.runtime.block_on(async {
            self.jetstream
                .publish(self.subject.clone(), payload)
                .await
                .map_err(text)?
                .await
                .map(|_| ())
                .map_err(text)
        })
    }
}

struct NatsConsumer {
    runtime: Arc<tokio::runtime::Runtime>,
    consumer: async_nats::jetstream::consumer::PullConsumer,
    unacked: Vec<async_nats::jetstream::Message>,
}

impl Consumer for NatsConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> Result<Vec<Vec<u8>>, String> {
        let messages: Vec<async_nats::jetstream::Message> = self.runtime.block_on(async {
            let mut batch = self
                .consumer
                .fetch()
                .max_messages(max)
                .expires(wait)
                .messages()
                .await
                .map_err(text)?;
            let mut got = Vec::new();
            while let Some(message) = batch.next().await {
                got.push(message.map_err(text)?);
            }
            Ok::<_, String>(got)
        })?;
        let payloads = messages.iter().map(|m| m.payload.to_vec()).collect();
        self.unacked.extend(messages);
        Ok(payloads)
    }

    fn ack(&mut self) -> Result<(), String> {
        let messages = std::mem::take(&mut self.unacked);
        self.runtime.block_on(async {
            for message in messages {
                message.ack().await.map_err(text)?;
            }
            Ok(())
        })
    }
}

// -------------------------------------------------------------- RabbitMQ

/// RabbitMQ through `amiquip` (blocking AMQP 0.9.1): producers share one
/// connection (amiquip runs an I/O thread per connection; 64 of them would
/// cost the client more CPU than the broker), a channel each; each consumer
/// has its own connection.
struct RabbitMq {
    url: String,
    shared: std::sync::Mutex<amiquip::Connection>,
}

impl RabbitMq {
    fn connect(url: &str) -> Result<Self, String> {
        let connection = amiquip::Connection::insecure_open(url).map_err(text)?;
        Ok(Self {
            url: url.to_string(),
            shared: std::sync::Mutex::new(connection),
        })
    }

    fn with_channel<T>(
        &self,
        f: impl FnOnce(&amiquip::Channel) -> amiquip::Result<T>,
    ) -> Result<T, String> {
        let mut connection = amiquip::Connection::insecure_open(&self.url).map_err(text)?;
        let channel = connection.open_channel(None).map_err(text)?;
        let result = f(&channel).map_err(text);
        connection.close().ok();
        result
    }
}

impl Driver for RabbitMq {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    fn durability(&self) -> Result<String, String> {
        // A quorum queue confirms a publish once its Raft log (Ra's WAL)
        // synced it; the sync method is the one knob.
        let output = std::process::Command::new("rabbitmqctl")
            .args([
                "-n",
                RABBITMQ_NODE,
                "eval",
                "{rabbit_misc:version(), application:get_env(ra, wal_sync_method)}.",
            ])
            .output()
            .map_err(|e| format!("rabbitmqctl: {e}"))?;
        let answer = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let method = if answer.contains("undefined") {
            "datasync (default)".to_string()
        } else {
            answer.clone()
        };
        Ok(format!(
            "rabbitmq {}: quorum queues, publisher confirms; Ra WAL sync method {method}",
            answer.split('"').nth(1).unwrap_or("?")
        ))
    }

    fn create_topic(&self, topic: &str, _partitions: u32) -> Result<(), String> {
        self.with_channel(|channel| {
            let mut arguments = amiquip::FieldTable::new();
            arguments.insert(
                "x-queue-type".into(),
                amiquip::AmqpValue::LongString("quorum".into()),
            );
            channel
                .queue_declare(
                    topic,
                    amiquip::QueueDeclareOptions {
                        durable: true,
                        arguments,
                        ..Default::default()
                    },
                )
                .map(|_| ())
        })
    }

    fn delete_topic(&self, topic: &str) -> Result<(), String> {
        self.with_channel(|channel| {
            let queue = channel.queue_declare_passive(topic)?;
            queue
                .delete(amiquip::QueueDeleteOptions::default())
                .map(|_| ())
        })
    }

    fn producer(&self, topic: &str) -> Result<Box<dyn Producer>, String> {
        let channel = self
            .shared
            .lock()
            .map_err(|_| "rabbitmq: connection lock poisoned".to_string())?
            .open_channel(None)
            .map_err(text)?;
        let confirms = channel.listen_for_publisher_confirms().map_err(text)?;
        channel.enable_publisher_confirms().map_err(text)?;
        Ok(Box::new(RabbitProducer {
            channel,
            confirms,
            queue: topic.to_string(),
            published: 0,
            confirmed: 0,
        }))
    }

    fn consumer(&self, topic: &str) -> Result<Box<dyn Consumer>, String> {
        // An amiquip consumer borrows its channel and stays on one thread:
        // that thread owns both and trades deliveries and acks by channel.
        let (url, queue) = (self.url.clone(), topic.to_string());
        let (deliveries_tx, deliveries) =
            crossbeam_channel::bounded(usize::from(RABBITMQ_PREFETCH));
        let (acks, acks_rx) = crossbeam_channel::unbounded::<amiquip::Delivery>();
        let (ready_tx, ready) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let setup = || -> amiquip::Result<(amiquip::Connection, amiquip::Channel)> {
                let mut connection = amiquip::Connection::insecure_open(&url)?;
                let channel = connection.open_channel(None)?;
                channel.qos(0, RABBITMQ_PREFETCH, false)?;
                Ok((connection, channel))
            };
            let (connection, channel) = match setup() {
                Ok(parts) => parts,
                Err(error) => {
                    ready_tx.send(Err(text(error))).ok();
                    return;
                }
            };
            let consumer = match channel
                .queue_declare_passive(queue)
                .and_then(|q| q.consume(amiquip::ConsumerOptions::default()))
            {
                Ok(consumer) => consumer,
                Err(error) => {
                    ready_tx.send(Err(text(error))).ok();
                    return;
                }
            };
            ready_tx.send(Ok(())).ok();
            loop {
                crossbeam_channel::select! {
                    recv(consumer.receiver()) -> message => match message {
                        Ok(amiquip::ConsumerMessage::Delivery(delivery)) => {
                            if deliveries_tx.send(delivery).is_err() {
                                break;
                            }
                        }
                        _ => break,
                    },
                    recv(acks_rx) -> last => match last {
                        Ok(last) => {
                            if consumer.ack_multiple(last).is_err() {
                                break;
                            }
                        }
                        Err(_) => break,
                    },
                }
            }
            drop(consumer);
            connection.close().ok();
        });
        ready
            .recv()
            .map_err(|_| "rabbitmq consumer thread ended".to_string())??;
        Ok(Box::new(RabbitConsumer {
            deliveries,
            acks,
            last: None,
        }))
    }
}

struct RabbitProducer {
    channel: amiquip::Channel,
    confirms: crossbeam_channel::Receiver<amiquip::Confirm>,
    queue: String,
    published: u64,
    confirmed: u64,
}

impl Producer for RabbitProducer {
    fn send(&mut self, _key: Option<&str>, payload: &[u8]) -> Result<(), String> {
        self.channel
            .basic_publish("", amiquip::Publish::new(payload, self.queue.as_str()))
            .map_err(text)?;
        self.published += 1;
        while self.confirmed < self.published {
            match self.confirms.recv().map_err(text)? {
                amiquip::Confirm::Ack(ack) => self.confirmed = ack.delivery_tag,
                amiquip::Confirm::Nack(nack) => {
                    self.confirmed = nack.delivery_tag;
                    return Err("rabbitmq refused a publish (nack)".into());
                }
            }
        }
        Ok(())
    }
}

struct RabbitConsumer {
    deliveries: crossbeam_channel::Receiver<amiquip::Delivery>,
    acks: crossbeam_channel::Sender<amiquip::Delivery>,
    last: Option<amiquip::Delivery>,
}

impl Consumer for RabbitConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> Result<Vec<Vec<u8>>, String> {
        let mut payloads = Vec::new();
        let mut next = match self.deliveries.recv_timeout(wait) {
            Ok(delivery) => Some(delivery),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                return Err("rabbitmq consumer ended".into())
            }
        };
        while let Some(delivery) = next {
            payloads.push(delivery.body.clone());
            self.last = Some(delivery);
            if payloads.len() >= max {
                break;
            }
            next = self.deliveries.try_recv().ok();
        }
        Ok(payloads)
    }

    fn ack(&mut self) -> Result<(), String> {
        match self.last.take() {
            Some(last) => self
                .acks
                .send(last)
                .map_err(|_| "rabbitmq consumer ended".to_string()),
            None => Ok(()),
        }
    }
}

// ----------------------------------------------------------------- Redis

/// Redis streams through the `redis` crate's blocking connections.
struct Redis {
    client: redis::Client,
}

impl Redis {
    fn connect(url: &str) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(text)?;
        let mut connection = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .map_err(text)?;
        redis::cmd("PING")
            .query::<String>(&mut connection)
            .map_err(text)?;
        Ok(Self { client })
    }

    fn connection(&self) -> Result<redis::Connection, String> {
        self.client.get_connection().map_err(text)
    }
}

impl Driver for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn durability(&self) -> Result<String, String> {
        let mut connection = self.connection()?;
        let setting = |name: &str, connection: &mut redis::Connection| {
            redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query::<Vec<String>>(connection)
                .map(|pair| pair.get(1).cloned().unwrap_or_default())
                .map_err(text)
        };
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut connection)
            .map_err(text)?;
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .to_string();
        Ok(format!(
            "redis {version}: appendonly {}, appendfsync {}",
            setting("appendonly", &mut connection)?,
            setting("appendfsync", &mut connection)?
        ))
    }

    fn create_topic(&self, topic: &str, _partitions: u32) -> Result<(), String> {
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(topic)
            .arg(GROUP)
            .arg("$")
            .arg("MKSTREAM")
            .query::<()>(&mut self.connection()?)
            .map_err(text)
    }

    fn delete_topic(&self, topic: &str) -> Result<(), String> {
        redis::cmd("DEL")
            .arg(topic)
            .query::<()>(&mut self.connection()?)
            .map_err(text)
    }

    fn producer(&self, topic: &str) -> Result<Box<dyn Producer>, String> {
        Ok(Box::new(RedisProducer {
            connection: self.connection()?,
            stream: topic.to_string(),
        }))
    }

    fn consumer(&self, topic: &str) -> Result<Box<dyn Consumer>, String> {
        Ok(Box::new(RedisConsumer {
            connection: self.connection()?,
            stream: topic.to_string(),
            name: format!("c{}", CONSUMER_IDS.fetch_add(1, Ordering::Relaxed)),
            unacked: Vec::new(),
        }))
    }
}

struct RedisProducer {
    connection: redis::Connection,
    stream: String,
}

impl Producer for RedisProducer {
    fn send(&mut self, _key: Option<&str>, payload: &[u8]) -> Result<(), String> {
        redis::cmd("XADD")
            .arg(&self.stream)
            .arg("*")
            .arg("v")
            .arg(payload)
            .query::<String>(&mut self.connection)
            .map(|_| ())
            .map_err(text)
    }
}

struct RedisConsumer {
    connection: redis::Connection,
    stream: String,
    name: String,
    unacked: Vec<String>,
}

impl Consumer for RedisConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> Result<Vec<Vec<u8>>, String> {
        let reply: Option<redis::streams::StreamReadReply> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(&self.name)
            .arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1))
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query(&mut self.connection)
            .map_err(text)?;
        let mut payloads = Vec::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                if let Some(payload) = entry.get::<Vec<u8>>("v") {
                    payloads.push(payload);
                }
                self.unacked.push(entry.id);
            }
        }
        Ok(payloads)
    }

    fn ack(&mut self) -> Result<(), String> {
        if self.unacked.is_empty() {
            return Ok(());
        }
        redis::cmd("XACK")
            .arg(&self.stream)
            .arg(GROUP)
            .arg(std::mem::take(&mut self.unacked))
            .query::<u64>(&mut self.connection)
            .map(|_| ())
            .map_err(text)
    }
}

/// Redis streams with pipelined producers: every producer thread hands its
/// `XADD` to one of [`PIPELINE_LANES`] lanes, each a thread with one
/// connection that sends everything queued since its last pipeline was
/// answered as the next pipeline. Each producer waits for its own reply.
struct RedisPipelined {
    redis: Redis,
    lanes: Vec<crossbeam_channel::Sender<Xadd>>,
    next: Arc<AtomicU64>,
}

/// Lanes of the pipelined producer: its best with 64 producers on this
/// machine among 1, 4, 8, 16 and 64 (docs/benchmarks.md);
/// `NARAD_BENCH_REDIS_LANES` sets another count.
const PIPELINE_LANES: usize = 8;
/// The most commands in one pipeline.
const PIPELINE_MAX: usize = 1000;

struct Xadd {
    stream: String,
    payload: Vec<u8>,
    done: crossbeam_channel::Sender<Result<(), String>>,
}

impl RedisPipelined {
    fn connect(url: &str) -> Result<Self, String> {
        let redis = Redis::connect(url)?;
        let lanes_wanted = std::env::var("NARAD_BENCH_REDIS_LANES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(PIPELINE_LANES);
        let mut lanes = Vec::new();
        for lane in 0..lanes_wanted {
            let mut connection = redis.connection()?;
            let (queue, queued) = crossbeam_channel::unbounded::<Xadd>();
            std::thread::Builder::new()
                .name(format!("redis-lane-{lane}"))
                .spawn(move || {
                    while let Ok(first) = queued.recv() {
                        let mut batch = vec![first];
                        while batch.len() < PIPELINE_MAX {
                            match queued.try_recv() {
                                Ok(next) => batch.push(next),
                                Err(_) => break,
                            }
                        }
                        let mut pipe = redis::pipe();
                        for xadd in &batch {
                            pipe.cmd("XADD")
                                .arg(&xadd.stream)
                                .arg("*")
                                .arg("v")
                                .arg(&xadd.payload);
                        }
                        let answer = pipe.query::<Vec<String>>(&mut connection).map_err(text);
                        for xadd in batch {
                            let _ = xadd
                                .done
                                .send(answer.as_ref().map(|_| ()).map_err(Clone::clone));
                        }
                    }
                })
                .map_err(text)?;
            lanes.push(queue);
        }
        Ok(Self {
            redis,
            lanes,
            next: Arc::new(AtomicU64::new(0)),
        })
    }
}

impl Driver for RedisPipelined {
    fn name(&self) -> &'static str {
        "redis-pipelined"
    }

    fn durability(&self) -> Result<String, String> {
        self.redis.durability()
    }

    fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), String> {
        self.redis.create_topic(topic, partitions)
    }

    fn delete_topic(&self, topic: &str) -> Result<(), String> {
        self.redis.delete_topic(topic)
    }

    fn producer(&self, topic: &str) -> Result<Box<dyn Producer>, String> {
        Ok(Box::new(PipelinedProducer {
            lanes: self.lanes.clone(),
            next: self.next.clone(),
            stream: topic.to_string(),
        }))
    }

    fn consumer(&self, topic: &str) -> Result<Box<dyn Consumer>, String> {
        self.redis.consumer(topic)
    }
}

struct PipelinedProducer {
    lanes: Vec<crossbeam_channel::Sender<Xadd>>,
    next: Arc<AtomicU64>,
    stream: String,
}

impl Producer for PipelinedProducer {
    fn send(&mut self, _key: Option<&str>, payload: &[u8]) -> Result<(), String> {
        let lane = self.next.fetch_add(1, Ordering::Relaxed) as usize % self.lanes.len();
        let (done, answered) = crossbeam_channel::bounded(1);
        self.lanes[lane]
            .send(Xadd {
                stream: self.stream.clone(),
                payload: payload.to_vec(),
                done,
            })
            .map_err(|_| "a redis lane ended".to_string())?;
        answered
            .recv()
            .map_err(|_| "a redis lane ended".to_string())?
    }
}

//! Narad through `narad-client`'s coalescing [`Producer`]: every producer
//! thread of a run hands its message to one shared producer, whose lanes
//! send what came meanwhile as one batch request each, a batch leaving when
//! the lane's last one is answered. Each producer still waits for its own
//! message's `202`, so the rate controller and histograms measure the same
//! thing as for the other drivers. Consumers are [`NaradDriver`]'s.
//! Selected with `--driver narad-coalescing`; its peer in a comparison is
//! `redis-pipelined`.

use std::sync::Arc;

use bytes::Bytes;
use narad_client::{Client, Producer as Coalescing, ProducerOptions};
use tokio::runtime::Runtime;

use crate::driver::{Consumer, Driver, NaradDriver, Producer};

/// Lanes of the shared producer (`NARAD_BENCH_LANES` sets another count).
/// One lane was the fastest on a two-shard node with 64 producers, among
/// 1, 2, 4, 8, 16 and 32 (docs/benchmarks.md).
const LANES: usize = 1;

pub struct CoalescingDriver {
    narad: NaradDriver,
    /// Runs the producer's lanes.
    runtime: Arc<Runtime>,
    producer: Arc<Coalescing>,
}

impl CoalescingDriver {
    pub fn new(server: &str) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let client = Client::builder(server).build().map_err(|e| e.to_string())?;
        let lanes = std::env::var("NARAD_BENCH_LANES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(LANES);
        let options = ProducerOptions {
            lanes,
            ..ProducerOptions::default()
        };
        let producer = {
            let _inside = runtime.enter();
            Coalescing::new(client, options)
        };
        Ok(Self {
            narad: NaradDriver::new(server)?,
            runtime: Arc::new(runtime),
            producer: Arc::new(producer),
        })
    }
}

impl Driver for CoalescingDriver {
    fn name(&self) -> &'static str {
        "narad-coalescing"
    }

    fn durability(&self) -> Result<String, String> {
        self.narad.durability()
    }

    fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), String> {
        self.narad.create_topic(topic, partitions)
    }

    fn delete_topic(&self, topic: &str) -> Result<(), String> {
        self.narad.delete_topic(topic)
    }

    fn producer(&self, topic: &str) -> Result<Box<dyn Producer>, String> {
        Ok(Box::new(CoalescingProducer {
            runtime: self.runtime.clone(),
            producer: self.producer.clone(),
            topic: topic.to_string(),
        }))
    }

    fn consumer(&self, topic: &str) -> Result<Box<dyn Consumer>, String> {
        self.narad.consumer(topic)
    }
}

struct CoalescingProducer {
    runtime: Arc<Runtime>,
    producer: Arc<Coalescing>,
    topic: String,
}

impl Producer for CoalescingProducer {
    fn send(&mut self, key: Option<&str>, payload: &[u8]) -> Result<(), String> {
        let value = Bytes::copy_from_slice(payload);
        self.runtime
            .handle()
            .block_on(self.producer.produce(&self.topic, key, value))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

//! OpenMessaging Benchmark workload files: the flat `key: value` YAML that
//! OMB's `workloads/*.yaml` use, and the open-loop send schedule.

use std::time::Duration;

/// How producers pick message keys (OMB's `keyDistributor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyDistributor {
    NoKey,
    KeyRoundRobin,
    RandomNano,
}

/// One OMB workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    pub topics: u32,
    pub partitions_per_topic: u32,
    pub message_size: usize,
    pub use_randomized_payloads: bool,
    pub random_bytes_ratio: f64,
    pub randomized_payload_pool_size: usize,
    pub key_distributor: KeyDistributor,
    pub subscriptions_per_topic: u32,
    pub consumer_per_subscription: u32,
    pub producers_per_topic: u32,
    /// Messages per second over all producers; 0 = as fast as possible.
    pub producer_rate: u64,
    pub consumer_backlog_size_gb: f64,
    pub test_duration_minutes: f64,
    pub warmup_duration_minutes: f64,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            name: "workload".into(),
            topics: 1,
            partitions_per_topic: 1,
            message_size: 1024,
            use_randomized_payloads: false,
            random_bytes_ratio: 0.0,
            randomized_payload_pool_size: 0,
            key_distributor: KeyDistributor::NoKey,
            subscriptions_per_topic: 1,
            consumer_per_subscription: 1,
            producers_per_topic: 1,
            producer_rate: 0,
            consumer_backlog_size_gb: 0.0,
            test_duration_minutes: 1.0,
            warmup_duration_minutes: 0.0,
        }
    }
}

fn parse_number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{key}: {value:?} is not a number"))
}

impl Workload {
    /// Parses a workload file. Unknown keys are refused, naming the key.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut workload = Self::default();
        for (number, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() || line == "---" {
                continue;
            }
            let (key, value) = line.split_once(':').ok_or_else(|| {
                format!("line {}: expected `key: value`, got {raw:?}", number + 1)
            })?;
            let key = key.trim();
            let value = value.trim().trim_matches('"').trim_matches('\'');
            match key {
                "name" => workload.name = value.to_string(),
                "topics" => workload.topics = parse_number(key, value)?,
                "partitionsPerTopic" => workload.partitions_per_topic = parse_number(key, value)?,
                "messageSize" => workload.message_size = parse_number(key, value)?,
                "useRandomizedPayloads" => {
                    workload.use_randomized_payloads = parse_number(key, value)?;
                }
                "randomBytesRatio" => workload.random_bytes_ratio = parse_number(key, value)?,
                "randomizedPayloadPoolSize" => {
                    workload.randomized_payload_pool_size = parse_number(key, value)?;
                }
                "keyDistributor" => {
                    workload.key_distributor = match value {
                        "NO_KEY" => KeyDistributor::NoKey,
                        "KEY_ROUND_ROBIN" => KeyDistributor::KeyRoundRobin,
                        "RANDOM_NANO" => KeyDistributor::RandomNano,
                        other => return Err(format!("keyDistributor: unknown {other:?}")),
                    }
                }
                "subscriptionsPerTopic" => {
                    workload.subscriptions_per_topic = parse_number(key, value)?;
                }
                "consumerPerSubscription" => {
                    workload.consumer_per_subscription = parse_number(key, value)?;
                }
                "producersPerTopic" => workload.producers_per_topic = parse_number(key, value)?,
                "producerRate" => workload.producer_rate = parse_number(key, value)?,
                "consumerBacklogSizeGB" => {
                    workload.consumer_backlog_size_gb = parse_number(key, value)?;
                }
                "testDurationMinutes" => workload.test_duration_minutes = parse_number(key, value)?,
                "warmupDurationMinutes" => {
                    workload.warmup_duration_minutes = parse_number(key, value)?;
                }
                other => return Err(format!("unknown workload key {other:?}")),
            }
        }
        if workload.topics == 0 || workload.partitions_per_topic == 0 {
            return Err("topics and partitionsPerTopic must be at least 1".into());
        }
        if workload.producers_per_topic == 0 {
            return Err("producersPerTopic must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&workload.random_bytes_ratio) {
            return Err("randomBytesRatio must be from 0 to 1".into());
        }
        Ok(workload)
    }

    pub fn test_duration(&self) -> Duration {
        Duration::from_secs_f64(self.test_duration_minutes.max(0.0) * 60.0)
    }

    pub fn warmup_duration(&self) -> Duration {
        Duration::from_secs_f64(self.warmup_duration_minutes.max(0.0) * 60.0)
    }

    pub fn producers(&self) -> u32 {
        self.topics * self.producers_per_topic
    }
}

/// When the `n`th message of one producer is due, open loop: producers send
/// on a fixed schedule whatever the broker's answers, and latency counts from
/// the due time (coordinated-omission correction). `None` when the rate is 0
/// (closed loop: send when the last answer came).
pub fn due_offset(n: u64, producer_rate: f64) -> Option<Duration> {
    (producer_rate > 0.0).then(|| Duration::from_secs_f64(n as f64 / producer_rate))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OMB_FILE: &str = "
name: 1 topic / 16 partitions / 1kb
# a comment
topics: 1
partitionsPerTopic: 16
messageSize: 1024
useRandomizedPayloads: true
randomBytesRatio: 0.5
randomizedPayloadPoolSize: 1000
keyDistributor: \"KEY_ROUND_ROBIN\"
subscriptionsPerTopic: 1
consumerPerSubscription: 4
producersPerTopic: 4
producerRate: 20000
consumerBacklogSizeGB: 0
testDurationMinutes: 2
warmupDurationMinutes: 0.5
";

    #[test]
    fn an_omb_file_parses_whole() {
        let w = Workload::parse(OMB_FILE).expect("parse");
        assert_eq!(w.name, "1 topic / 16 partitions / 1kb");
        assert_eq!(
            (w.topics, w.partitions_per_topic, w.message_size),
            (1, 16, 1024)
        );
        assert!(w.use_randomized_payloads);
        assert_eq!(w.key_distributor, KeyDistributor::KeyRoundRobin);
        assert_eq!((w.producers(), w.consumer_per_subscription), (4, 4));
        assert_eq!(w.producer_rate, 20_000);
        assert_eq!(w.test_duration(), Duration::from_secs(120));
        assert_eq!(w.warmup_duration(), Duration::from_secs(30));
    }

    #[test]
    fn bad_files_are_refused_naming_the_problem() {
        assert!(Workload::parse("topic: 1").unwrap_err().contains("topic"));
        assert!(Workload::parse("topics: many")
            .unwrap_err()
            .contains("topics"));
        assert!(Workload::parse("keyDistributor: ZIPF")
            .unwrap_err()
            .contains("ZIPF"));
        assert!(Workload::parse("just words").is_err());
        assert!(Workload::parse("producersPerTopic: 0").is_err());
    }

    #[test]
    fn every_shipped_workload_parses_and_fits_a_compare_run() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
        let mut count = 0;
        let mut compare_run = Duration::ZERO;
        for entry in std::fs::read_dir(&dir).expect("workloads dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            let w = Workload::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                w.test_duration() <= Duration::from_secs(120),
                "{}: at most 2 minutes of test",
                path.display()
            );
            // Narad and three peers, each with its warm-up and at worst the
            // whole drain allowance.
            compare_run +=
                4 * (w.test_duration() + w.warmup_duration() + crate::omb::DRAIN_DEADLINE);
            count += 1;
        }
        assert!(count >= 6, "the bundled workloads are there");
        assert!(
            compare_run <= Duration::from_secs(45 * 60),
            "a compare run of every workload fits in 45 minutes: {compare_run:?}"
        );
    }

    /// The workloads kept for taking builds of Narad in turns
    /// (`bench/run-ab.sh`), outside the set a compare run takes.
    #[test]
    fn every_workload_for_builds_in_turns_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/ab");
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).expect("workloads/ab dir") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("read");
            let w = Workload::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                w.test_duration() <= Duration::from_secs(120),
                "{}",
                path.display()
            );
            count += 1;
        }
        assert!(count >= 2, "the keyed workloads are there");
    }

    #[test]
    fn the_schedule_is_fixed_by_the_rate() {
        assert_eq!(due_offset(0, 1000.0), Some(Duration::ZERO));
        assert_eq!(due_offset(500, 1000.0), Some(Duration::from_millis(500)));
        assert_eq!(due_offset(7, 0.0), None, "rate 0: closed loop");
    }
}

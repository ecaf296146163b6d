//! Idempotency keys the ring holds until they expire.
//!
//! A record with an idempotency key must stay readable to recovery until the
//! key expires, although the record itself is committed (and its space would
//! otherwise be reclaimed) long before. So the ring reclaims space only up to
//! the oldest frame that holds a key still in its window (the checkpoint
//! names that position beside the tail recovery redispatches from), and the
//! keys that hold frames behind the tail more than [`CARRY_FILL_PERCENT`] of
//! the ring old are appended again as key-only records; a checkpoint lets
//! their old frames go only once those are durable. Each key is thus carried at most
//! once per that share of the ring's traffic, and a key always stands in at
//! least one durable frame at or after the checkpoint's keys position.

use std::collections::{BTreeMap, HashMap};

use super::record::{Idempotency, WalRecord};
use super::WalPos;

/// Past this fill of the ring, keys behind the tail are carried forward.
pub const CARRY_FILL_PERCENT: u64 = 50;

/// What a held key needs to be written again as a key-only record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    pub id: u128,
    pub topic: String,
    pub topic_incarnation: Option<u64>,
    pub partition: u32,
    pub accept_ms: u64,
    pub idempotency: Idempotency,
}

impl HeldKey {
    /// The key of `record`, if it has one.
    pub fn of(record: &WalRecord) -> Option<Self> {
        Some(Self {
            id: record.id,
            topic: record.topic.clone(),
            topic_incarnation: record.topic_incarnation,
            partition: record.partition,
            accept_ms: record.accept_ms,
            idempotency: record.idempotency.clone()?,
        })
    }

    /// The key-only record that carries it forward.
    pub fn carried(&self) -> WalRecord {
        WalRecord {
            id: self.id,
            topic: self.topic.clone(),
            partition: self.partition,
            key: None,
            value: Vec::new(),
            accept_ms: self.accept_ms,
            topic_incarnation: self.topic_incarnation,
            offset: None,
            idempotency: Some(self.idempotency.clone()),
            key_only: true,
        }
    }
}

/// The keys of the ring's frames by position, at most `max` of them (past
/// it the oldest frame's key is let go: the node forgets it early).
#[derive(Debug, Default)]
pub struct HeldKeys {
    by_pos: BTreeMap<WalPos, HeldKey>,
    max: usize,
    /// Keys let go before they expired, because of `max` or a full ring.
    pub forgotten: u64,
    /// When [`Self::expire`] last looked at every key.
    swept_at_ms: Option<u64>,
}

/// How often [`HeldKeys::expire`] looks past the oldest frames for keys
/// that expired out of order (a topic with a shorter window): such a key
/// may be held this much longer, which costs only ring room. Looking at
/// every key at each checkpoint cost a few percent of a busy shard.
const KEYS_SWEEP_INTERVAL_MS: u64 = 1_000;

impl HeldKeys {
    pub fn new(max: usize) -> Self {
        Self {
            by_pos: BTreeMap::new(),
            max,
            forgotten: 0,
            swept_at_ms: None,
        }
    }

    /// Keys found by recovery, in position order: one frame per record's
    /// key (a key carried forward whose old frame was not yet let go
    /// appears twice; the newer frame stands for it).
    pub fn recovered(max: usize, found: impl IntoIterator<Item = (WalPos, HeldKey)>) -> Self {
        type Identity = (u128, String, Option<u64>, Vec<u8>);
        let mut newest: HashMap<Identity, WalPos> = HashMap::new();
        let mut by_pos = BTreeMap::new();
        for (pos, key) in found {
            let identity = (
                key.id,
                key.topic.clone(),
                key.topic_incarnation,
                key.idempotency.key.clone(),
            );
            if let Some(old) = newest.insert(identity, pos) {
                by_pos.remove(&old);
            }
            by_pos.insert(pos, key);
        }
        let mut keys = Self {
            by_pos,
            max,
            forgotten: 0,
            swept_at_ms: None,
        };
        keys.bound();
        keys
    }

    pub fn len(&self) -> usize {
        self.by_pos.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_pos.is_empty()
    }

    pub fn insert(&mut self, pos: WalPos, key: HeldKey) {
        self.by_pos.insert(pos, key);
        self.bound();
    }

    fn bound(&mut self) {
        while self.by_pos.len() > self.max {
            self.by_pos.pop_first();
            self.forgotten += 1;
        }
    }

    /// Lets go of keys that expired by `now_ms`: those of the oldest
    /// frames at each call (keys mostly expire in the order they came), and
    /// every one at most every [`KEYS_SWEEP_INTERVAL_MS`].
    pub fn expire(&mut self, now_ms: u64) {
        while let Some(oldest) = self.by_pos.first_entry() {
            if oldest.get().idempotency.expires_ms > now_ms {
                break;
            }
            oldest.remove();
        }
        if self
            .swept_at_ms
            .is_none_or(|at| now_ms.saturating_sub(at) >= KEYS_SWEEP_INTERVAL_MS)
        {
            self.by_pos
                .retain(|_, key| key.idempotency.expires_ms > now_ms);
            self.swept_at_ms = Some(now_ms);
        }
    }

    /// The oldest position a key holds.
    pub fn first_pos(&self) -> Option<WalPos> {
        self.by_pos.keys().next().copied()
    }

    /// Takes the keys held by frames before `pos`, oldest first.
    pub fn take_before(&mut self, pos: WalPos) -> Vec<HeldKey> {
        let rest = self.by_pos.split_off(&pos);
        let taken = std::mem::replace(&mut self.by_pos, rest);
        taken.into_values().collect()
    }

    /// Every key held, oldest frame first.
    pub fn iter(&self) -> impl Iterator<Item = (WalPos, &HeldKey)> {
        self.by_pos.iter().map(|(pos, key)| (*pos, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, expires_ms: u64) -> HeldKey {
        HeldKey {
            id: u128::from(name.as_bytes()[0]),
            topic: "t".into(),
            topic_incarnation: Some(3),
            partition: 0,
            accept_ms: 0,
            idempotency: Idempotency {
                key: name.as_bytes().to_vec(),
                expires_ms,
            },
        }
    }

    #[test]
    fn the_oldest_frame_is_let_go_past_the_bound_and_expired_keys_go() {
        let mut keys = HeldKeys::new(2);
        keys.insert(10, key("a", 100));
        keys.insert(20, key("b", 50));
        keys.insert(30, key("c", 100));
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.forgotten, 1);
        assert_eq!(keys.first_pos(), Some(20));
        keys.expire(50);
        assert_eq!(keys.first_pos(), Some(30));
        assert_eq!(keys.take_before(31).len(), 1);
        assert!(keys.is_empty());
    }

    /// The oldest frames' keys go at every look; one that expired behind a
    /// key that still holds goes at the next full sweep.
    #[test]
    fn keys_expired_out_of_order_go_at_the_next_sweep() {
        let mut keys = HeldKeys::new(10);
        keys.expire(0);
        keys.insert(10, key("a", 100));
        keys.insert(20, key("b", 5_000));
        keys.insert(30, key("c", 200));
        keys.expire(300);
        let held: Vec<WalPos> = keys.iter().map(|(pos, _)| pos).collect();
        assert_eq!(held, vec![20, 30], "c waits behind b until the sweep");
        keys.expire(KEYS_SWEEP_INTERVAL_MS);
        let held: Vec<WalPos> = keys.iter().map(|(pos, _)| pos).collect();
        assert_eq!(held, vec![20]);
    }

    #[test]
    fn a_key_found_twice_by_recovery_stands_at_its_newer_frame() {
        // Records "a" at 10 and its copy carried to 30; "b" at 20.
        let keys = HeldKeys::recovered(
            10,
            [
                (10, key("a", 100)),
                (20, key("b", 100)),
                (30, key("a", 100)),
            ],
        );
        let held: Vec<WalPos> = keys.iter().map(|(pos, _)| pos).collect();
        assert_eq!(held, vec![20, 30]);
        assert_eq!(keys.forgotten, 0);
    }
}

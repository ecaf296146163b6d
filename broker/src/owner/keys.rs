//! The idempotency keys a partition committed within its topic's window:
//! the owner's side of idempotent produce. A retry sent to another node is
//! accepted there under a new id, and its copy meets the first at this
//! partition (every copy of a key goes to the partition the key picks); the
//! owner drops it and answers its commit as done, so the accepting node's
//! WAL lets it go.
//!
//! Keys are remembered in commit order, each with the time its window
//! started (its copy's accept time at the node that took it, or the commit
//! if the clocks disagree), as the accepting node counts it: a first copy
//! committed late does not stretch the window over a later message that
//! uses the key again after it. A key is forgotten once the window (read
//! at each look, so a topic update applies at once) has passed since, or
//! when the table holds
//! [`OWNER_IDEMPOTENCY_KEYS_MAX`] keys (oldest first, counted). At open the
//! table is rebuilt from the log's tail: the keys of batches appended
//! within the window, among the last [`OWNER_IDEMPOTENCY_KEYS_MAX`] records.
//!
//! A copy is only ever dropped for one durable in the log: a commit's keys
//! are remembered after its synced append, and a journal batch's as it is
//! written behind, but every commit syncs what the journal wrote behind
//! before it judges (`owner/journal.rs`). So a dropped copy's commit never
//! answers done for a first copy a power cut could still take away.

use std::collections::{HashMap, HashSet, VecDeque};

use bytes::Bytes;
use narad_storage::log::{Message, RecentIdempotencyKey};

use crate::limits::OWNER_IDEMPOTENCY_KEYS_MAX;

/// The id of a key's copy read back from the log (no id is 0: ids carry
/// the id of their node, which starts at 1).
const ID_NOT_KNOWN: u128 = 0;

/// What the owner holds of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Committed {
    /// When the key's window started.
    at_ms: u64,
    /// The id of the copy that was kept.
    id: u128,
}

/// The table. Keys come from clients, so the map keeps the standard
/// library's keyed hash (no crafted flood of colliding keys).
#[derive(Debug, Default)]
pub(super) struct OwnerKeys {
    by_key: HashMap<Bytes, Committed>,
    /// Keys in commit order, with their commit time: a key whose entry
    /// in `by_key` has another time was committed again after it expired,
    /// and this entry is stale.
    order: VecDeque<(u64, Bytes)>,
    /// Keys let go before their window ended (the table was full).
    forgotten: u64,
}

/// How a commit's messages fared against the table.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Judged {
    /// Indexes of the messages to append.
    pub keep: Vec<usize>,
    /// Copies of a key committed before (under another id) within the
    /// window, or earlier in the same commit: dropped.
    pub duplicates: u32,
}

impl OwnerKeys {
    /// Whether `key` was committed within `window_ms` before `now_ms`, and
    /// under which id.
    fn live(&self, key: &[u8], window_ms: u64, now_ms: u64) -> Option<u128> {
        self.by_key
            .get(key)
            .filter(|c| c.at_ms.saturating_add(window_ms) > now_ms)
            .map(|c| c.id)
    }

    /// Judges a commit's messages, in order: a message whose key is live
    /// under another id is a duplicate (dropped, counted); under its own id
    /// it is a repeat of a commit already appended (dropped, not counted);
    /// a key seen earlier in the same commit is a duplicate too.
    pub(super) fn judge(&self, messages: &[Message], window_ms: u64, now_ms: u64) -> Judged {
        let mut judged = Judged::default();
        let mut seen: HashSet<&[u8]> = HashSet::new();
        for (index, message) in messages.iter().enumerate() {
            let key = match &message.idempotency_key {
                Some(key) if window_ms > 0 => key,
                _ => {
                    judged.keep.push(index);
                    continue;
                }
            };
            match self.live(key, window_ms, now_ms) {
                Some(id) if id == message.id => {}
                Some(_) => judged.duplicates += 1,
                None if !seen.insert(key) => judged.duplicates += 1,
                None => judged.keep.push(index),
            }
        }
        judged
    }

    /// Remembers the keys of messages just made durable, each from its
    /// accept time (the commit's, if earlier: another node's clock).
    pub(super) fn remember(&mut self, messages: &[Message], window_ms: u64, now_ms: u64) {
        if window_ms == 0 {
            return;
        }
        for message in messages {
            if let Some(key) = &message.idempotency_key {
                let since = message.produced_at_ms.min(now_ms);
                self.insert(key.clone(), message.id, since, now_ms, window_ms);
            }
        }
    }

    /// Puts back keys read from the log's tail at open, oldest first. The
    /// log keeps no id beside a key, so a repeat of a commit appended
    /// before the restart counts as a duplicate (it is dropped all the
    /// same).
    pub(super) fn restore(&mut self, keys: Vec<RecentIdempotencyKey>, window_ms: u64) {
        for key in keys {
            self.insert(key.key, ID_NOT_KNOWN, key.since_ms, key.since_ms, window_ms);
        }
    }

    fn insert(&mut self, key: Bytes, id: u128, at_ms: u64, now_ms: u64, window_ms: u64) {
        if self.live(&key, window_ms, now_ms).is_some() {
            return;
        }
        self.expire(window_ms, now_ms);
        while self.by_key.len() >= OWNER_IDEMPOTENCY_KEYS_MAX {
            if !self.pop_oldest() {
                break;
            }
            self.forgotten += 1;
        }
        self.by_key.insert(key.clone(), Committed { at_ms, id });
        self.order.push_back((at_ms, key));
    }

    /// Forgets keys whose window ended by `now_ms`, from the oldest on (one
    /// accepted long before its neighbours waits for them; `live` does not
    /// count it meanwhile).
    pub(super) fn expire(&mut self, window_ms: u64, now_ms: u64) {
        while let Some((at_ms, _)) = self.order.front() {
            if at_ms.saturating_add(window_ms) > now_ms {
                break;
            }
            self.pop_oldest();
        }
    }

    /// Drops the oldest entry of the order (and its key, unless that key
    /// was committed again since); whether there was one.
    fn pop_oldest(&mut self) -> bool {
        let Some((at_ms, key)) = self.order.pop_front() else {
            return false;
        };
        if self.by_key.get(&key).is_some_and(|c| c.at_ms == at_ms) {
            self.by_key.remove(&key);
        }
        true
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Keys let go before their window ended, since the last call.
    pub(super) fn take_forgotten(&mut self) -> u64 {
        std::mem::take(&mut self.forgotten)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A keyed message accepted no earlier than it is committed: its
    /// window starts at the commit.
    fn keyed(id: u128, key: &str) -> Message {
        Message {
            id,
            produced_at_ms: u64::MAX,
            key: None,
            value: Bytes::from_static(b"v"),
            idempotency_key: Some(Bytes::from(key.to_string())),
        }
    }

    const WINDOW: u64 = 1_000;

    #[test]
    fn a_second_copy_within_the_window_is_dropped_and_after_it_kept() {
        let mut keys = OwnerKeys::default();
        keys.remember(&[keyed(1, "a")], WINDOW, 100);
        let retry = [keyed(2, "a"), keyed(3, "b")];
        let judged = keys.judge(&retry, WINDOW, 1_099);
        assert_eq!(judged.keep, vec![1], "the copy of a is dropped");
        assert_eq!(judged.duplicates, 1);
        let later = keys.judge(&retry, WINDOW, 1_100);
        assert_eq!(later.keep, vec![0, 1], "the window ended");
        assert_eq!(later.duplicates, 0);
    }

    #[test]
    fn a_repeat_of_the_same_copy_is_dropped_but_not_counted() {
        let mut keys = OwnerKeys::default();
        keys.remember(&[keyed(1, "a")], WINDOW, 0);
        let judged = keys.judge(&[keyed(1, "a")], WINDOW, 10);
        assert_eq!(judged, Judged::default());
    }

    #[test]
    fn two_copies_in_one_commit_keep_the_first() {
        let keys = OwnerKeys::default();
        let judged = keys.judge(&[keyed(1, "a"), keyed(2, "a")], WINDOW, 0);
        assert_eq!(judged.keep, vec![0]);
        assert_eq!(judged.duplicates, 1);
    }

    #[test]
    fn a_window_of_zero_keeps_everything() {
        let mut keys = OwnerKeys::default();
        keys.remember(&[keyed(1, "a")], 0, 0);
        assert_eq!(keys.len(), 0);
        assert_eq!(keys.judge(&[keyed(2, "a")], 0, 0).keep, vec![0]);
    }

    #[test]
    fn a_full_table_forgets_the_oldest_and_counts_it() {
        let mut keys = OwnerKeys::default();
        let window = u64::MAX / 2;
        for i in 0..=OWNER_IDEMPOTENCY_KEYS_MAX as u128 {
            keys.remember(&[keyed(i, &format!("k{i}"))], window, 1);
        }
        assert_eq!(keys.len(), OWNER_IDEMPOTENCY_KEYS_MAX);
        assert_eq!(keys.take_forgotten(), 1);
        assert_eq!(keys.judge(&[keyed(99, "k0")], window, 2).keep, vec![0]);
        assert_eq!(keys.judge(&[keyed(99, "k1")], window, 2).duplicates, 1);
    }

    /// A first copy committed late (its node was down) holds its key for
    /// the window from its accept time, as the node that took it counts,
    /// not from the commit: a message that uses the key again after that
    /// is stored.
    #[test]
    fn the_window_starts_at_the_first_copys_accept_time() {
        let mut keys = OwnerKeys::default();
        let late = Message {
            produced_at_ms: 100,
            ..keyed(1, "a")
        };
        keys.remember(&[late], WINDOW, 1_000);
        assert_eq!(keys.judge(&[keyed(2, "a")], WINDOW, 1_050).duplicates, 1);
        assert_eq!(keys.judge(&[keyed(3, "a")], WINDOW, 1_100).keep, vec![0]);
    }

    #[test]
    fn a_key_committed_again_after_expiry_lives_its_new_window() {
        let mut keys = OwnerKeys::default();
        keys.remember(&[keyed(1, "a")], WINDOW, 0);
        keys.remember(&[keyed(2, "a")], WINDOW, 1_500);
        // The stale first entry goes; the second stays.
        keys.expire(WINDOW, 1_600);
        assert_eq!(keys.judge(&[keyed(3, "a")], WINDOW, 1_600).duplicates, 1);
        keys.expire(WINDOW, 2_500);
        assert_eq!(keys.len(), 0);
    }
}

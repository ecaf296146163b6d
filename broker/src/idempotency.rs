//! Idempotent produce at the node that accepts: the idempotency keys this
//! node accepted within their topic's window, for every shard of the node
//! (a retry may arrive on another connection, served by another shard).
//!
//! A key goes through three states. A produce *claims* its keys in one
//! step before it writes anything (an item whose key is held already is a
//! duplicate of the holder's id). The shard that appends the record to its
//! WAL marks the key *written* in the same step as the append, and the
//! WAL's committer marks it *durable* once the group commit covering it
//! returned. A duplicate answers once its first copy is durable, so a
//! duplicate's 202 promises no more than the first copy's. A produce that
//! claimed and wrote nothing (it failed, or its client went away) lets its
//! claims go when its [`ClaimGuard`] drops; what was appended stays
//! claimed, whatever becomes of the request.
//!
//! The records' keys live in the WAL until they expire (`storage/src/wal/
//! keys.rs`); at start every shard puts those it recovered back here before
//! the node takes keyed produces.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use narad_storage::wal::HeldKey;

/// What one key is known by: its topic (with the incarnation, so a topic
/// created again starts with no keys) and the producer's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyId {
    pub topic: Arc<str>,
    pub incarnation: u64,
    pub key: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A produce will write it; nothing is appended yet.
    Claimed,
    /// Appended to a WAL, not yet durable.
    Written,
    /// In a durable WAL record.
    Durable,
}

#[derive(Debug)]
struct Entry {
    /// The id of the copy that holds the key.
    id: u128,
    expires_ms: u64,
    state: State,
    /// Duplicates waiting for the copy to be durable.
    waiters: Vec<Waker>,
}

impl Entry {
    fn wake(&mut self) {
        for waker in self.waiters.drain(..) {
            waker.wake();
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    entries: HashMap<Arc<KeyId>, Entry>,
    /// Every entry by when it expires (and its id, unique): the soonest
    /// first.
    by_expiry: BTreeMap<(u64, u128), Arc<KeyId>>,
    /// Keys let go before they expired, because the table was full.
    forgotten: u64,
}

impl Table {
    /// Lets go of keys that expired by `now_ms`, and of those nearest
    /// their end while more than `max` are held.
    fn prune(&mut self, now_ms: u64, max: usize) {
        while let Some((&(expires_ms, _), key)) = self.by_expiry.first_key_value() {
            if expires_ms > now_ms && self.entries.len() <= max {
                return;
            }
            if expires_ms > now_ms {
                self.forgotten += 1;
            }
            let key = key.clone();
            if let Some(mut entry) = self.remove(&key) {
                entry.wake();
            }
        }
    }

    /// Removes a key's entry (with its place in the expiry order).
    fn remove(&mut self, key: &KeyId) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.by_expiry.remove(&(entry.expires_ms, entry.id));
        Some(entry)
    }

    fn hold(&mut self, key: Arc<KeyId>, id: u128, expires_ms: u64, state: State) {
        if let Some(mut old) = self.remove(&key) {
            old.wake();
        }
        self.by_expiry.insert((expires_ms, id), key.clone());
        self.entries.insert(
            key,
            Entry {
                id,
                expires_ms,
                state,
                waiters: Vec::new(),
            },
        );
    }
}

/// A key as one copy holds it: the key and the copy's id.
pub type HeldCopy = (Arc<KeyId>, u128);

/// Whether one item of a produce is new or a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The key was not held: this produce writes the item.
    New,
    /// The key is held by the copy `first`; `durable`: that copy was
    /// durable when claimed (nothing to wait for).
    Duplicate { first: u128, durable: bool },
}

/// One item of a produce to claim: its key, the id it would get, and when
/// its key expires.
pub struct Wanted {
    pub key: Arc<KeyId>,
    pub id: u128,
    pub expires_ms: u64,
}

/// The node's table of idempotency keys.
#[derive(Debug)]
pub struct NodeKeys {
    table: Mutex<Table>,
    /// At most this many keys (the WAL's per-shard bound times the shards).
    max: usize,
    /// WAL rings whose recovered keys are back.
    loaded: AtomicUsize,
    /// WAL rings to wait for: the shards', and those of removed shards
    /// that shards adopt.
    expected: AtomicUsize,
}

impl NodeKeys {
    pub fn new(max: usize, shards: usize) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(Table::default()),
            max,
            loaded: AtomicUsize::new(0),
            expected: AtomicUsize::new(shards),
        })
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while the lock was held leaves a table that is still
        // whole (every change is one map operation): go on with it.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts back a key a shard's WAL recovery found (durable by then).
    pub fn recovered(&self, key: KeyId, id: u128, expires_ms: u64, now_ms: u64) {
        if expires_ms <= now_ms {
            return;
        }
        let mut table = self.table();
        let key = Arc::new(key);
        match table.entries.get(&key) {
            // The first copy stands.
            Some(held) if held.expires_ms > now_ms => {}
            _ => table.hold(key, id, expires_ms, State::Durable),
        }
        table.prune(now_ms, self.max);
    }

    /// Puts back the keys a WAL's recovery found (records of topics
    /// without an incarnation, from an old release, hold none).
    pub fn recover<'a>(&self, found: impl IntoIterator<Item = &'a HeldKey>, now_ms: u64) {
        for held in found {
            let Some(incarnation) = held.topic_incarnation else {
                continue;
            };
            let key = KeyId {
                topic: Arc::from(held.topic.as_str()),
                incarnation,
                key: held.idempotency.key.clone(),
            };
            self.recovered(key, held.id, held.idempotency.expires_ms, now_ms);
        }
    }

    /// A shard will adopt `rings` rings of removed shards: keyed produces
    /// wait for their keys too. Called before that shard's
    /// [`Self::shard_loaded`].
    pub fn expect_adopted(&self, rings: usize) {
        self.expected.fetch_add(rings, Ordering::SeqCst);
    }

    /// One ring's recovered keys are back (a shard's own, or an adopted
    /// one, also when it could not be read).
    pub fn shard_loaded(&self) {
        self.loaded.fetch_add(1, Ordering::SeqCst);
    }

    /// Every ring's recovered keys are back: keyed produces may be
    /// answered.
    pub fn ready(&self) -> bool {
        self.loaded.load(Ordering::SeqCst) >= self.expected.load(Ordering::SeqCst)
    }

    /// Claims the keys of a produce's items in one step, in order (an item
    /// whose key an earlier item of the same produce holds is a duplicate
    /// of it). The guard lets go of what is still only claimed when it
    /// drops.
    pub fn claim(self: &Arc<Self>, now_ms: u64, wanted: &[Wanted]) -> (Vec<Claim>, ClaimGuard) {
        let mut table = self.table();
        table.prune(now_ms, self.max);
        let mut claims = Vec::with_capacity(wanted.len());
        let mut claimed = Vec::new();
        for item in wanted {
            let held = table
                .entries
                .get(&item.key)
                .filter(|e| e.expires_ms > now_ms)
                .map(|e| (e.id, e.state == State::Durable));
            match held {
                Some((first, durable)) => claims.push(Claim::Duplicate { first, durable }),
                None => {
                    table.hold(item.key.clone(), item.id, item.expires_ms, State::Claimed);
                    claimed.push((item.key.clone(), item.id));
                    claims.push(Claim::New);
                }
            }
        }
        table.prune(now_ms, self.max);
        drop(table);
        let guard = ClaimGuard {
            keys: self.clone(),
            claimed,
        };
        (claims, guard)
    }

    /// The record holding `key` under `id` was appended to a WAL (called
    /// in the same step as the append). A claim let go meanwhile is taken
    /// again, unless another copy holds the key by now.
    pub fn written(&self, key: &Arc<KeyId>, id: u128, expires_ms: u64) {
        let mut table = self.table();
        match table.entries.get_mut(key) {
            Some(entry) if entry.id == id => {
                if entry.state == State::Claimed {
                    entry.state = State::Written;
                }
            }
            Some(_) => {}
            None => table.hold(key.clone(), id, expires_ms, State::Written),
        }
    }

    /// The records holding these keys are durable.
    pub fn durable<'a>(&self, keys: impl IntoIterator<Item = &'a HeldCopy>) {
        let mut table = self.table();
        for (key, id) in keys {
            if let Some(entry) = table.entries.get_mut(key).filter(|e| e.id == *id) {
                entry.state = State::Durable;
                entry.wake();
            }
        }
    }

    /// The records holding these keys will never be durable (their WAL
    /// failed): the keys are let go, and their duplicates answered.
    pub fn lost<'a>(&self, keys: impl IntoIterator<Item = &'a HeldCopy>) {
        let mut table = self.table();
        for (key, id) in keys {
            let held = table.entries.get(key).is_some_and(|e| e.id == *id);
            if held {
                if let Some(mut entry) = table.remove(key) {
                    entry.wake();
                }
            }
        }
    }

    /// Completes once the copy `id` holding `key` is durable (`Ok`), or is
    /// let go without becoming durable (`Err`).
    pub fn durable_copy(self: &Arc<Self>, key: Arc<KeyId>, id: u128) -> DurableCopy {
        DurableCopy {
            keys: self.clone(),
            key,
            id,
        }
    }

    /// Keys held, and keys let go early because the table was full.
    pub fn stats(&self) -> (usize, u64) {
        let table = self.table();
        (table.entries.len(), table.forgotten)
    }
}

/// The claims of one produce; dropping it lets go of those no WAL holds.
/// The produce holds it until its records are appended: from then on its
/// keys are written, whatever becomes of the request.
#[must_use]
pub struct ClaimGuard {
    keys: Arc<NodeKeys>,
    claimed: Vec<HeldCopy>,
}

impl std::fmt::Debug for ClaimGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClaimGuard({} claims)", self.claimed.len())
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if self.claimed.is_empty() {
            return;
        }
        let mut table = self.keys.table();
        for (key, id) in self.claimed.drain(..) {
            let unwritten = table
                .entries
                .get(&key)
                .is_some_and(|e| e.id == id && e.state == State::Claimed);
            if unwritten {
                if let Some(mut entry) = table.remove(&key) {
                    entry.wake();
                }
            }
        }
    }
}

/// See [`NodeKeys::durable_copy`].
pub struct DurableCopy {
    keys: Arc<NodeKeys>,
    key: Arc<KeyId>,
    id: u128,
}

/// The first copy of a duplicate was let go before it became durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyLost;

impl Future for DurableCopy {
    type Output = Result<(), CopyLost>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut table = self.keys.table();
        match table.entries.get_mut(&self.key).filter(|e| e.id == self.id) {
            None => Poll::Ready(Err(CopyLost)),
            Some(entry) if entry.state == State::Durable => Poll::Ready(Ok(())),
            Some(entry) => {
                if !entry.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                    entry.waiters.push(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::{block_on, poll_once};

    fn key(name: &str) -> Arc<KeyId> {
        Arc::new(KeyId {
            topic: Arc::from("orders"),
            incarnation: 1,
            key: name.as_bytes().to_vec(),
        })
    }

    fn wanted(name: &str, id: u128, expires_ms: u64) -> Wanted {
        Wanted {
            key: key(name),
            id,
            expires_ms,
        }
    }

    #[test]
    fn a_key_held_is_a_duplicate_of_the_first_id_until_it_expires() {
        let keys = NodeKeys::new(100, 1);
        let (claims, guard) = keys.claim(0, &[wanted("a", 1, 100), wanted("a", 2, 100)]);
        let unwritten = Claim::Duplicate {
            first: 1,
            durable: false,
        };
        assert_eq!(claims, vec![Claim::New, unwritten]);
        keys.written(&key("a"), 1, 100);
        drop(guard);
        keys.durable(&[(key("a"), 1)]);
        let (claims, _guard) = keys.claim(99, &[wanted("a", 3, 200)]);
        let durable = Claim::Duplicate {
            first: 1,
            durable: true,
        };
        assert_eq!(claims, vec![durable]);
        drop(_guard);
        let (claims, _guard) = keys.claim(100, &[wanted("a", 4, 200)]);
        assert_eq!(claims, vec![Claim::New], "expired at 100");
    }

    #[test]
    fn a_claim_nothing_wrote_is_let_go_and_its_duplicates_learn_it() {
        let keys = NodeKeys::new(100, 1);
        let (_, guard) = keys.claim(0, &[wanted("a", 1, 100)]);
        let mut waiting = keys.durable_copy(key("a"), 1);
        assert!(block_on(poll_once(&mut waiting)).is_none());
        drop(guard);
        assert_eq!(block_on(waiting), Err(CopyLost));
        let (claims, _guard) = keys.claim(1, &[wanted("a", 2, 100)]);
        assert_eq!(claims, vec![Claim::New]);
    }

    #[test]
    fn a_written_key_outlives_its_claim_and_answers_once_durable() {
        let keys = NodeKeys::new(100, 1);
        let (_, guard) = keys.claim(0, &[wanted("a", 1, 100)]);
        keys.written(&key("a"), 1, 100);
        drop(guard);
        let mut waiting = keys.durable_copy(key("a"), 1);
        assert!(block_on(poll_once(&mut waiting)).is_none());
        keys.durable(&[(key("a"), 1)]);
        assert_eq!(block_on(waiting), Ok(()));
        // A write whose claim was let go first takes the key again.
        keys.written(&key("b"), 7, 100);
        let (claims, _guard) = keys.claim(1, &[wanted("b", 8, 100)]);
        let written = Claim::Duplicate {
            first: 7,
            durable: false,
        };
        assert_eq!(claims, vec![written]);
    }

    #[test]
    fn a_lost_write_lets_its_key_go() {
        let keys = NodeKeys::new(100, 1);
        let (_, guard) = keys.claim(0, &[wanted("a", 1, 100)]);
        keys.written(&key("a"), 1, 100);
        drop(guard);
        keys.lost(&[(key("a"), 1)]);
        assert_eq!(block_on(keys.durable_copy(key("a"), 1)), Err(CopyLost));
    }

    #[test]
    fn past_the_bound_the_oldest_key_is_forgotten() {
        let keys = NodeKeys::new(2, 1);
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let (_, guard) = keys.claim(0, &[wanted(name, i as u128, 100)]);
            keys.written(&key(name), i as u128, 100);
            drop(guard);
        }
        assert_eq!(keys.stats(), (2, 1));
        let (claims, _guard) = keys.claim(0, &[wanted("a", 9, 100)]);
        assert_eq!(claims, vec![Claim::New]);
    }

    #[test]
    fn expired_keys_go_whatever_their_order_and_the_nearest_end_goes_first_when_full() {
        let keys = NodeKeys::new(2, 1);
        // A long window first, then two short ones.
        for (name, id, expires_ms) in [("long", 1, 1_000), ("a", 2, 10), ("b", 3, 20)] {
            let (_, guard) = keys.claim(0, &[wanted(name, id, expires_ms)]);
            keys.written(&key(name), id, expires_ms);
            drop(guard);
        }
        // Full at 3 of 2: "a", nearest its end, was forgotten.
        assert_eq!(keys.stats(), (2, 1));
        let (_, guard) = keys.claim(15, &[]);
        drop(guard);
        assert_eq!(keys.stats(), (2, 1), "b still held at 15");
        let (claims, _guard) = keys.claim(25, &[wanted("long", 9, 1_000)]);
        assert!(matches!(claims[0], Claim::Duplicate { first: 1, .. }));
        assert_eq!(keys.stats().0, 1, "b expired behind the long window");
    }

    #[test]
    fn recovered_keys_are_durable_and_the_first_copy_stands() {
        let keys = NodeKeys::new(100, 2);
        assert!(!keys.ready());
        let id = |n: &str| KeyId {
            topic: Arc::from("orders"),
            incarnation: 1,
            key: n.as_bytes().to_vec(),
        };
        keys.recovered(id("a"), 1, 100, 0);
        keys.recovered(id("a"), 2, 100, 0);
        keys.recovered(id("old"), 3, 10, 20);
        keys.shard_loaded();
        keys.shard_loaded();
        assert!(keys.ready());
        assert_eq!(block_on(keys.durable_copy(key("a"), 1)), Ok(()));
        let (claims, _guard) = keys.claim(20, &[wanted("a", 5, 100), wanted("old", 6, 100)]);
        let recovered = Claim::Duplicate {
            first: 1,
            durable: true,
        };
        assert_eq!(claims, vec![recovered, Claim::New]);
    }
}

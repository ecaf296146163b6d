//! The long polls parked on one shard, by topic, and what this shard knows
//! of its node's other shards' messages: wake-ups that follow the work.
//!
//! A gain of `n` messages of a topic wakes the parked polls of that topic
//! whose room covers `n`, first parked first; polls of other topics sleep
//! on. What the polls here do not cover goes to the node's other shards
//! (the shard posts it). A woken poll owes its wake-up to the others until
//! it finished its round: dropped before (its client went away) it passes
//! the wake-up on, and a round that filled its room passes one on, since
//! more may be left.
//!
//! A poll that was not parked when a gain came (it was running a round)
//! parks anyway if the gain was covered by polls parked here; if some of
//! it was not, the topic's version moved, and the poll runs another round
//! instead of parking, so no gain falls between a round and the park.
//!
//! Shards known to have nothing: a round that asked shard `x` for all the
//! topic's partitions there and got nothing marks `x` empty, as of the last
//! wake-up heard from `x`. Shard `x` in turn remembers that it was asked
//! ([`PollWaiters::asked`]) and posts its next gain of the topic to every
//! other shard, even one its own polls covered, so the mark ends. A mark
//! is trusted only while no wake-up from `x` was heard since the question
//! left, whatever order the answer and the wake-up arrive in.
//!
//! Every version and mark is a stamp from one counter that only grows, so
//! an entry forgotten (see [`TOPICS_KEPT`]) and made again never repeats a
//! stamp a poll saw: a forgotten topic reads as `floor`, the last stamp
//! given when entries were forgotten.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::signal::Signal;

/// Entries of topics with nobody parked and nothing owed are forgotten
/// once there are more than this many (topics come and go).
pub const TOPICS_KEPT: usize = 1024;

/// A gain whose size is not known (a partition moved here, a stop): wakes
/// every poll of the topic.
pub const EVERY_POLL: u32 = u32::MAX;

pub struct PollWaiters {
    /// This node's shards, and this shard's index among them.
    shards: usize,
    me: usize,
    entries: RefCell<HashMap<String, Entry>>,
    /// The last stamp given, and the highest stamp of a forgotten entry.
    stamp: Cell<u64>,
    floor: Cell<u64>,
    next_id: Cell<u64>,
    /// Polls woken and not yet returned, each with the messages of the
    /// gain it owes (`None`: woken for everything, owing nothing).
    woken: RefCell<HashMap<u64, Option<u32>>>,
    /// Wake-ups for the node's other shards, by topic (their counts
    /// added), and whether every poll there is to be woken: the shard's
    /// forwarding task sends them ([`PollWaiters::take_forward`]). Never
    /// dropped when a channel is full, unlike a post: a wake-up names its
    /// topic, and another one queued does not stand for it.
    forward: RefCell<BTreeMap<String, u32>>,
    forward_all: Cell<bool>,
    pub forward_due: Signal,
}

struct Entry {
    /// Stamp of the last gain or wake-up of this topic that the polls
    /// parked here did not cover.
    version: u64,
    /// Per shard: stamp of the last wake-up heard from it.
    heard: Vec<u64>,
    /// Per shard: `heard` when it last answered that it had nothing.
    empty: Vec<Option<u64>>,
    /// Another shard asked here since the last gain was posted.
    asked: bool,
    parked: VecDeque<Parked>,
}

struct Parked {
    id: u64,
    room: u32,
    waker: Waker,
}

impl PollWaiters {
    pub fn new(shards: usize, me: usize) -> Self {
        Self {
            shards,
            me,
            entries: RefCell::default(),
            stamp: Cell::new(0),
            floor: Cell::new(0),
            next_id: Cell::new(0),
            woken: RefCell::default(),
            forward: RefCell::default(),
            forward_all: Cell::new(false),
            forward_due: Signal::default(),
        }
    }

    fn next_stamp(&self) -> u64 {
        let stamp = self.stamp.get() + 1;
        self.stamp.set(stamp);
        stamp
    }

    fn with_entry<R>(&self, topic: &str, f: impl FnOnce(&mut Entry) -> R) -> R {
        let mut entries = self.entries.borrow_mut();
        if !entries.contains_key(topic) {
            if entries.len() >= TOPICS_KEPT {
                self.forget_idle(&mut entries);
            }
            let floor = self.floor.get();
            entries.insert(
                topic.to_string(),
                Entry {
                    version: floor,
                    heard: vec![floor; self.shards],
                    empty: vec![None; self.shards],
                    asked: false,
                    parked: VecDeque::new(),
                },
            );
        }
        f(entries.get_mut(topic).expect("inserted above"))
    }

    /// Forgets topics nobody waits on here. One that other shards asked
    /// about is posted to them first (their marks end with it).
    fn forget_idle(&self, entries: &mut HashMap<String, Entry>) {
        entries.retain(|topic, entry| {
            let keep = !entry.parked.is_empty();
            if !keep && entry.asked {
                self.forward(topic, 0);
            }
            keep
        });
        self.floor.set(self.stamp.get());
    }

    /// The topic's version now: a poll reads it before its round and parks
    /// only if it did not move (no gain since that parked polls did not
    /// cover).
    pub fn version(&self, topic: &str) -> u64 {
        self.entries
            .borrow()
            .get(topic)
            .map_or(self.floor.get(), |e| e.version)
    }

    /// `count` messages of `topic` became available on this shard: wakes
    /// polls here whose room covers them. Returns what they did not cover
    /// and whether other shards must hear of it anyway (one asked here).
    pub fn gained(&self, topic: &str, count: u32) -> (u32, bool) {
        let stamp = self.next_stamp();
        self.with_entry(topic, |entry| {
            let left = self.wake(entry, count);
            if left > 0 {
                entry.version = stamp;
            }
            (left, std::mem::take(&mut entry.asked))
        })
    }

    /// Another node gained `count` messages of `topic`: wakes polls here
    /// that cover them and returns what is left. Unlike [`Self::gained`],
    /// what other shards know of this one stays as it is (it gained
    /// nothing).
    pub fn gained_elsewhere(&self, topic: &str, count: u32) -> u32 {
        let stamp = self.next_stamp();
        self.with_entry(topic, |entry| {
            let left = self.wake(entry, count);
            if left > 0 {
                entry.version = stamp;
            }
            left
        })
    }

    /// Shard `from` gained `count` messages of `topic` that its own polls
    /// did not cover (or was asked about it): wakes polls here that cover
    /// them, and ends this shard's mark of `from`.
    pub fn heard(&self, topic: &str, from: usize, count: u32) {
        let stamp = self.next_stamp();
        self.with_entry(topic, |entry| {
            if let Some(heard) = entry.heard.get_mut(from) {
                *heard = stamp;
            }
            if self.wake(entry, count) > 0 {
                entry.version = stamp;
            }
        });
    }

    /// Wakes every parked poll of every topic, which then owe nothing (a
    /// stop, a change of placement, another node's messages), and ends
    /// every mark.
    pub fn wake_all(&self) {
        let stamp = self.next_stamp();
        self.floor.set(stamp);
        let mut woken = self.woken.borrow_mut();
        for entry in self.entries.borrow_mut().values_mut() {
            entry.version = stamp;
            entry.heard.fill(stamp);
            for parked in entry.parked.drain(..) {
                woken.insert(parked.id, None);
                parked.waker.wake();
            }
        }
    }

    /// Wakes parked polls from the front until their room covers `count`;
    /// returns what is left.
    fn wake(&self, entry: &mut Entry, mut count: u32) -> u32 {
        let mut woken = self.woken.borrow_mut();
        while count > 0 {
            let Some(parked) = entry.parked.pop_front() else {
                break;
            };
            let share = count.min(parked.room.max(1));
            count -= share;
            woken.insert(parked.id, Some(share));
            parked.waker.wake();
        }
        count
    }

    /// A woken poll could not use its wake-up: the next poll here takes it,
    /// or the other shards.
    fn pass_on(&self, topic: &str, count: u32) {
        let (left, asked) = self.gained(topic, count);
        if left > 0 || asked {
            self.forward(topic, left);
        }
    }

    /// Queues a gain of `count` messages of `topic` (0: only what other
    /// shards know of this one ends) for the node's other shards.
    pub fn forward(&self, topic: &str, count: u32) {
        let mut forward = self.forward.borrow_mut();
        match forward.get_mut(topic) {
            Some(queued) => *queued = queued.saturating_add(count),
            None => {
                forward.insert(topic.to_string(), count);
            }
        }
        self.forward_due.notify();
    }

    /// Queues a wake-up of every poll of the node's other shards.
    pub fn forward_every_poll(&self) {
        self.forward_all.set(true);
        self.forward_due.notify();
    }

    /// What is queued for the other shards: whether every poll is to be
    /// woken, and the gains by topic.
    pub fn take_forward(&self) -> (bool, Vec<(String, u32)>) {
        let all = self.forward_all.replace(false);
        let gains = std::mem::take(&mut *self.forward.borrow_mut());
        (all, gains.into_iter().collect())
    }

    /// Parks a poll of `topic` with room for `room` messages until a gain
    /// wakes it, unless the topic's version moved past `seen`.
    pub fn wait<'a>(&'a self, topic: &'a str, room: u32, seen: u64) -> Wait<'a> {
        Wait {
            waiters: self,
            topic,
            room,
            seen,
            id: None,
        }
    }

    /// Polls parked now (for tests and gauges).
    pub fn parked(&self) -> usize {
        self.entries.borrow().values().map(|e| e.parked.len()).sum()
    }

    /// Another shard asks here for the topic's messages: the next gain is
    /// posted to the other shards, whatever polls here cover.
    pub fn asked(&self, topic: &str) {
        self.with_entry(topic, |entry| entry.asked = true);
    }

    /// Read before asking shard `shard`: what [`Self::found_empty`] keeps.
    pub fn asking(&self, topic: &str, shard: usize) -> u64 {
        self.entries
            .borrow()
            .get(topic)
            .and_then(|e| e.heard.get(shard).copied())
            .unwrap_or(self.floor.get())
    }

    /// Shard `shard` had nothing of the topic when asked (`asked_at` from
    /// [`Self::asking`]).
    pub fn found_empty(&self, topic: &str, shard: usize, asked_at: u64) {
        self.with_entry(topic, |entry| {
            if let Some(empty) = entry.empty.get_mut(shard) {
                *empty = Some(asked_at);
            }
        });
    }

    /// Whether shard `shard` is known to have nothing of the topic: it said
    /// so, and no wake-up came from it since it was asked.
    pub fn known_empty(&self, topic: &str, shard: usize) -> bool {
        shard != self.me
            && self.entries.borrow().get(topic).is_some_and(|e| {
                matches!((e.empty.get(shard), e.heard.get(shard)),
                    (Some(Some(at)), Some(heard)) if at == heard)
            })
    }
}

/// A parked poll; completes with what it owes once woken.
pub struct Wait<'a> {
    waiters: &'a PollWaiters,
    topic: &'a str,
    room: u32,
    seen: u64,
    id: Option<u64>,
}

impl<'a> Future for Wait<'a> {
    type Output = Woken<'a>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Woken<'a>> {
        let waiters = self.waiters;
        let owes = match self.id {
            None if waiters.version(self.topic) != self.seen => Some(None),
            None => {
                let id = waiters.next_id.get();
                waiters.next_id.set(id + 1);
                self.id = Some(id);
                let (room, waker) = (self.room, cx.waker().clone());
                waiters.with_entry(self.topic, |e| {
                    e.parked.push_back(Parked { id, room, waker })
                });
                None
            }
            Some(id) => match waiters.woken.borrow_mut().remove(&id) {
                Some(owes) => Some(owes),
                None => {
                    let mut entries = waiters.entries.borrow_mut();
                    let parked = entries
                        .get_mut(self.topic)
                        .and_then(|e| e.parked.iter_mut().find(|p| p.id == id));
                    if let Some(parked) = parked {
                        parked.waker.clone_from(cx.waker());
                    }
                    None
                }
            },
        };
        match owes {
            Some(owes) => {
                self.id = None;
                Poll::Ready(Woken {
                    waiters,
                    topic: self.topic,
                    room: self.room,
                    owes: owes.unwrap_or(0),
                })
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let Some(id) = self.id else {
            return;
        };
        let owed = self.waiters.woken.borrow_mut().remove(&id);
        match owed {
            Some(Some(share)) => self.waiters.pass_on(self.topic, share),
            Some(None) => {}
            None => {
                if let Some(entry) = self.waiters.entries.borrow_mut().get_mut(self.topic) {
                    entry.parked.retain(|p| p.id != id);
                }
            }
        }
    }
}

/// A poll woken for messages of its topic. Its round ends with
/// [`Woken::finish`]; dropped before that, it passes its wake-up on.
pub struct Woken<'a> {
    waiters: &'a PollWaiters,
    topic: &'a str,
    room: u32,
    /// The messages of the gain it was woken for (0: woken for
    /// everything, or by a moved version).
    owes: u32,
}

impl Woken<'_> {
    /// The round after the wake-up took `got` messages. One that filled its
    /// room with more than it was woken for found messages nobody was told
    /// of: it passes a wake-up on, since more may be left.
    pub fn finish(mut self, got: usize) {
        if self.owes > 0 && got >= self.room as usize && got > self.owes as usize {
            self.waiters.pass_on(self.topic, 1);
        }
        self.owes = 0;
    }
}

impl Drop for Woken<'_> {
    fn drop(&mut self) {
        if self.owes > 0 {
            self.waiters.pass_on(self.topic, self.owes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    fn park<'a>(waiters: &'a PollWaiters, topic: &'a str, room: u32) -> Pin<Box<Wait<'a>>> {
        let mut wait = Box::pin(waiters.wait(topic, room, waiters.version(topic)));
        assert!(wait.as_mut().poll(&mut cx()).is_pending());
        wait
    }

    fn ready<'a>(wait: &mut Pin<Box<Wait<'a>>>) -> Option<Woken<'a>> {
        match wait.as_mut().poll(&mut cx()) {
            Poll::Ready(woken) => Some(woken),
            Poll::Pending => None,
        }
    }

    #[test]
    fn a_gain_wakes_only_polls_of_its_topic_and_only_as_many_as_it_covers() {
        let waiters = PollWaiters::new(2, 0);
        let mut a1 = park(&waiters, "a", 1);
        let mut a2 = park(&waiters, "a", 1);
        let mut a3 = park(&waiters, "a", 10);
        let mut b = park(&waiters, "b", 1);
        assert_eq!(waiters.gained("a", 2), (0, false));
        ready(&mut a1).expect("woken").finish(1);
        ready(&mut a2).expect("woken").finish(1);
        assert!(ready(&mut a3).is_none());
        assert!(ready(&mut b).is_none());
        // A poll with room for ten covers a gain of five; nothing is left.
        assert_eq!(waiters.gained("a", 5), (0, false));
        ready(&mut a3).expect("woken").finish(5);
        // Nobody parked: the whole gain is left for the other shards.
        assert_eq!(waiters.gained("a", 3), (3, false));
        assert_eq!(waiters.parked(), 1);
    }

    #[test]
    fn a_gain_while_a_poll_runs_its_round_stops_it_from_parking_unless_covered() {
        let waiters = PollWaiters::new(1, 0);
        // Covered by a poll parked: the one running its round parks too.
        let mut parked = park(&waiters, "a", 1);
        let seen = waiters.version("a");
        waiters.gained("a", 1);
        let mut wait = Box::pin(waiters.wait("a", 1, seen));
        assert!(ready(&mut wait).is_none());
        drop(wait);
        ready(&mut parked).expect("woken").finish(1);
        // Not covered: it runs another round.
        let seen = waiters.version("a");
        waiters.gained("a", 1);
        let mut wait = Box::pin(waiters.wait("a", 1, seen));
        let woken = ready(&mut wait).expect("the version moved");
        assert_eq!(woken.owes, 0);
        drop(woken);
        assert_eq!(waiters.take_forward(), (false, vec![]));
        // A gain of another topic does not.
        let seen = waiters.version("a");
        waiters.gained("b", 1);
        let mut wait = Box::pin(waiters.wait("a", 1, seen));
        assert!(ready(&mut wait).is_none());
    }

    #[test]
    fn a_woken_poll_dropped_before_its_round_passes_its_wake_up_on() {
        let waiters = PollWaiters::new(2, 0);
        let first = park(&waiters, "a", 1);
        let mut second = park(&waiters, "a", 1);
        waiters.gained("a", 1);
        // Its client went away before the poll ran again.
        drop(first);
        ready(&mut second).expect("passed on").finish(1);
        assert_eq!(waiters.take_forward(), (false, vec![]));
        // Nobody left here: the next one goes to the other shards.
        let mut third = park(&waiters, "a", 1);
        waiters.gained("a", 1);
        let woken = ready(&mut third).expect("woken");
        drop(woken);
        assert_eq!(waiters.take_forward(), (false, vec![("a".to_string(), 1)]));
    }

    #[test]
    fn a_round_that_fills_its_room_beyond_its_wake_up_wakes_the_next_poll() {
        let waiters = PollWaiters::new(1, 0);
        let mut first = park(&waiters, "a", 2);
        let mut second = park(&waiters, "a", 2);
        let mut third = park(&waiters, "a", 1);
        waiters.gained("a", 1);
        // Woken for one, it found two: messages nobody was told of.
        ready(&mut first).expect("woken").finish(2);
        let woken = ready(&mut second).expect("passed on");
        // This round took less than its room: nothing more is left.
        woken.finish(1);
        assert!(ready(&mut third).is_none());
        // A poll with room for one that took the one it was woken for
        // wakes nobody.
        waiters.gained("a", 1);
        ready(&mut third).expect("woken").finish(1);
        assert_eq!(waiters.take_forward(), (false, vec![]));
        assert_eq!(waiters.gained("a", 1), (1, false));
    }

    #[test]
    fn a_poll_that_times_out_leaves_nothing_parked() {
        let waiters = PollWaiters::new(1, 0);
        let polls: Vec<_> = (0..100).map(|_| park(&waiters, "a", 1)).collect();
        assert_eq!(waiters.parked(), 100);
        drop(polls);
        assert_eq!(waiters.parked(), 0);
        assert_eq!(waiters.gained("a", 1), (1, false));
    }

    #[test]
    fn a_mark_holds_until_its_shard_posts_a_gain_whatever_the_order() {
        let waiters = PollWaiters::new(3, 0);
        let asked_at = waiters.asking("a", 1);
        waiters.found_empty("a", 1, asked_at);
        assert!(waiters.known_empty("a", 1));
        assert!(!waiters.known_empty("a", 2));
        // A gain here or heard from another shard leaves the mark.
        waiters.gained("a", 1);
        waiters.heard("a", 2, 1);
        assert!(waiters.known_empty("a", 1));
        waiters.heard("a", 1, 0);
        assert!(!waiters.known_empty("a", 1));
        // The wake-up arrives before the answer that said "empty".
        let asked_at = waiters.asking("a", 1);
        waiters.heard("a", 1, 0);
        waiters.found_empty("a", 1, asked_at);
        assert!(!waiters.known_empty("a", 1));
    }

    #[test]
    fn a_shard_asked_posts_its_next_gain_even_when_its_polls_cover_it() {
        let waiters = PollWaiters::new(2, 1);
        let _poll = park(&waiters, "a", 5);
        waiters.asked("a");
        assert_eq!(waiters.gained("a", 1), (0, true));
        assert_eq!(waiters.gained("a", 1), (1, false));
    }

    #[test]
    fn forgotten_topics_never_read_as_unchanged_and_post_what_was_asked() {
        let waiters = PollWaiters::new(2, 0);
        waiters.asked("t0");
        let seen = waiters.version("t0");
        for i in 1..=TOPICS_KEPT {
            waiters.gained(&format!("t{i}"), 1);
        }
        assert!(!waiters.entries.borrow().contains_key("t0"));
        assert_eq!(waiters.take_forward(), (false, vec![("t0".to_string(), 0)]));
        // Made again by a gain: its version moved past what a poll saw.
        waiters.gained("t0", 1);
        assert_ne!(waiters.version("t0"), seen);
        // Marks of forgotten topics are gone, never stale.
        let asked_at = waiters.asking("t1", 1);
        waiters.found_empty("t1", 1, asked_at);
        assert!(waiters.known_empty("t1", 1));
    }

    #[test]
    fn wake_all_wakes_every_poll_owing_nothing_and_ends_every_mark() {
        let waiters = PollWaiters::new(2, 0);
        let mut a = park(&waiters, "a", 1);
        let mut b = park(&waiters, "b", 1);
        let asked_at = waiters.asking("a", 1);
        waiters.found_empty("a", 1, asked_at);
        waiters.wake_all();
        assert_eq!(ready(&mut a).expect("woken").owes, 0);
        assert_eq!(ready(&mut b).expect("woken").owes, 0);
        assert!(!waiters.known_empty("a", 1));
        assert_eq!(waiters.take_forward(), (false, vec![]));
    }
}

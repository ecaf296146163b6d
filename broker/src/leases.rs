//! The leases of one partition, held only in its owner's memory.
//!
//! Pure logic: time comes in as `now_ms`, on the monotonic clock (so a
//! step of the wall clock neither ends a lease early nor holds it longer;
//! answers show a lease's end on the wall clock, [`narad_storage::clock::
//! Now::wall_of`]), acks come from the partition's
//! consumer state as runs of offsets not acked. A lease has ended once
//! `now_ms` passes its `expires_at_ms`, even before a sweep removes it; after
//! an ack, a nack or an owner restart (a new table) it has ended too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;

/// One live lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub lease_id: u64,
    pub expires_at_ms: u64,
    /// Deliveries of this offset since the owner started (1 on the first).
    pub delivery_count: u32,
}

/// The lease named by a receipt has ended: the message is or will be
/// delivered again (API: 410 `lease_gone`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lease has ended")]
pub struct LeaseGone;

/// A lease that ended without an ack, as the sweep found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    pub offset: u64,
    pub delivery_count: u32,
}

#[derive(Debug, Default)]
pub struct LeaseTable {
    leases: HashMap<u64, Lease>,
    by_expiry: BTreeSet<(u64, u64)>,
    /// Nacked with a delay: offset → when it becomes available.
    delayed: HashMap<u64, u64>,
    delivery_counts: HashMap<u64, u32>,
    /// Held back from delivery (being moved to a dead-letter topic).
    parked: BTreeSet<u64>,
    /// Every offset with a lease, a delay or a park entry (possibly lapsed),
    /// and the first instant it may be delivered (`None`: not while parked):
    /// the only offsets that may be unavailable, so [`Self::available`]
    /// looks nothing else up. Kept by [`Self::settle`].
    held: BTreeMap<u64, Option<u64>>,
    next_lease_id: u64,
}

impl LeaseTable {
    pub fn new() -> Self {
        Self::starting_at(1)
    }

    /// A table whose first lease is `first` (at least 1).
    pub fn starting_at(first: u64) -> Self {
        Self {
            next_lease_id: first.max(1),
            ..Self::default()
        }
    }

    /// Leases currently held (expired ones not yet swept are not counted).
    pub fn in_flight(&self, now_ms: u64) -> usize {
        self.by_expiry.range((now_ms, 0)..).count()
    }

    /// Whether `offset` may be delivered now (the caller checks acks).
    pub fn is_available(&self, offset: u64, now_ms: u64) -> bool {
        let leased = self
            .leases
            .get(&offset)
            .is_some_and(|l| now_ms <= l.expires_at_ms);
        let delayed = self.delayed.get(&offset).is_some_and(|at| now_ms < *at);
        !leased && !delayed && !self.parked.contains(&offset)
    }

    /// Up to `max` offsets in `from..high_watermark` that are not acked and
    /// may be delivered now, lowest first.
    ///
    /// `unacked_run(x)` gives offsets not acked: it starts at the lowest one
    /// at or after `x`, and every offset in it is not acked (it may stop short
    /// of the next acked one; [`narad_storage::consumer::AckSet::unacked_run`]
    /// does not).
    ///
    /// Jumps over acked ranges whole and looks up only the held offsets it
    /// meets, so the cost is in the acked ranges and held offsets passed plus
    /// `max`, not in `high_watermark - from`: one lease never acked at the
    /// frontier does not make every consume walk the backlog.
    pub fn available(
        &self,
        from: u64,
        high_watermark: u64,
        max: usize,
        now_ms: u64,
        unacked_run: impl Fn(u64) -> Range<u64>,
    ) -> Vec<u64> {
        let mut found = Vec::new();
        let mut offset = from;
        // `next_held` is the lowest held offset at or after `offset`.
        let mut held = self.held.range(from..);
        let mut next_held = held.next();
        while found.len() < max {
            let run = unacked_run(offset);
            if run.start > offset {
                offset = run.start;
                if next_held.is_some_and(|(at, _)| *at < offset) {
                    held = self.held.range(offset..);
                    next_held = held.next();
                }
            }
            if offset >= high_watermark {
                break;
            }
            let end = run.end.clamp(offset + 1, high_watermark);
            while offset < end && found.len() < max {
                match next_held {
                    Some((&at, &free_from)) if at == offset => {
                        if free_from.is_some_and(|free_from| now_ms >= free_from) {
                            found.push(offset);
                        }
                        offset += 1;
                        next_held = held.next();
                    }
                    _ => {
                        // Neither acked nor held up to the next held offset.
                        let free_end = next_held.map_or(end, |(at, _)| (*at).min(end));
                        let wanted = u64::try_from(max - found.len()).unwrap_or(u64::MAX);
                        let taken = (free_end - offset).min(wanted);
                        found.extend(offset..offset + taken);
                        offset += taken;
                    }
                }
            }
        }
        found
    }

    /// Leases `offset` for `visibility_ms`. The caller has checked that it is
    /// available.
    pub fn lease(&mut self, offset: u64, now_ms: u64, visibility_ms: u64) -> Lease {
        debug_assert!(
            self.is_available(offset, now_ms),
            "offset {offset} leased twice"
        );
        self.remove_lease(offset);
        self.delayed.remove(&offset);
        let count = self.delivery_counts.entry(offset).or_insert(0);
        *count = count.saturating_add(1);
        let lease = Lease {
            lease_id: self.next_lease_id,
            expires_at_ms: now_ms.saturating_add(visibility_ms),
            delivery_count: *count,
        };
        self.next_lease_id += 1;
        self.leases.insert(offset, lease);
        self.by_expiry.insert((lease.expires_at_ms, offset));
        self.settle(offset);
        lease
    }

    /// The live lease `lease_id` on `offset`, or [`LeaseGone`].
    pub fn check(&self, offset: u64, lease_id: u64, now_ms: u64) -> Result<Lease, LeaseGone> {
        match self.leases.get(&offset) {
            Some(lease) if lease.lease_id == lease_id && now_ms <= lease.expires_at_ms => {
                Ok(*lease)
            }
            _ => Err(LeaseGone),
        }
    }

    /// Ends the lease for an ack (the caller records the ack).
    pub fn ack(&mut self, offset: u64, lease_id: u64, now_ms: u64) -> Result<(), LeaseGone> {
        self.check(offset, lease_id, now_ms)?;
        self.remove_lease(offset);
        self.delivery_counts.remove(&offset);
        self.settle(offset);
        Ok(())
    }

    /// Ends the lease at once; with `delay_ms` the message becomes available
    /// again only after it.
    pub fn nack(
        &mut self,
        offset: u64,
        lease_id: u64,
        delay_ms: u64,
        now_ms: u64,
    ) -> Result<Lease, LeaseGone> {
        let lease = self.check(offset, lease_id, now_ms)?;
        self.remove_lease(offset);
        if delay_ms > 0 {
            self.delayed.insert(offset, now_ms.saturating_add(delay_ms));
        }
        self.settle(offset);
        Ok(lease)
    }

    /// Moves the lease's end to `now + visibility_ms`; returns the new end.
    pub fn extend(
        &mut self,
        offset: u64,
        lease_id: u64,
        visibility_ms: u64,
        now_ms: u64,
    ) -> Result<u64, LeaseGone> {
        let lease = self.check(offset, lease_id, now_ms)?;
        self.by_expiry.remove(&(lease.expires_at_ms, offset));
        let expires_at_ms = now_ms.saturating_add(visibility_ms);
        self.leases.insert(
            offset,
            Lease {
                expires_at_ms,
                ..lease
            },
        );
        self.by_expiry.insert((expires_at_ms, offset));
        self.settle(offset);
        Ok(expires_at_ms)
    }

    /// Takes back a lease that never reached a consumer (the consume that
    /// granted it failed or was dropped): the offset is available again at
    /// once and the delivery is not counted.
    pub fn unlease(&mut self, offset: u64, lease_id: u64) {
        if self
            .leases
            .get(&offset)
            .is_some_and(|l| l.lease_id == lease_id)
        {
            self.remove_lease(offset);
            self.settle(offset);
            if let Some(count) = self.delivery_counts.get_mut(&offset) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.delivery_counts.remove(&offset);
                }
            }
        }
    }

    /// Removes every lease that ended before `now_ms` and returns them, so
    /// the owner can dead-letter those that reached their delivery limit.
    pub fn sweep(&mut self, now_ms: u64) -> Vec<Expired> {
        let ended: Vec<(u64, u64)> = self.by_expiry.range(..(now_ms, 0)).copied().collect();
        ended
            .into_iter()
            .filter_map(|(_, offset)| {
                let lease = self.leases.remove(&offset)?;
                self.by_expiry.remove(&(lease.expires_at_ms, offset));
                self.settle(offset);
                Some(Expired {
                    offset,
                    delivery_count: lease.delivery_count,
                })
            })
            .collect()
    }

    /// Whether `offset` is out with a live lease now (not once it ran out,
    /// even before a sweep).
    pub fn is_leased(&self, offset: u64, now_ms: u64) -> bool {
        self.leases
            .get(&offset)
            .is_some_and(|l| now_ms <= l.expires_at_ms)
    }

    /// Deliveries of `offset` since the owner started.
    pub fn delivery_count(&self, offset: u64) -> u32 {
        self.delivery_counts.get(&offset).copied().unwrap_or(0)
    }

    /// Holds `offset` back from delivery (while it moves to a dead-letter topic).
    pub fn park(&mut self, offset: u64) {
        self.remove_lease(offset);
        self.parked.insert(offset);
        self.settle(offset);
    }

    /// Releases a parked offset (the move failed; deliver it again).
    pub fn unpark(&mut self, offset: u64) {
        self.parked.remove(&offset);
        self.settle(offset);
    }

    /// Forgets everything below `offset` (all of it is acked or gone).
    pub fn forget_below(&mut self, offset: u64) {
        let stale: Vec<u64> = self
            .leases
            .keys()
            .copied()
            .filter(|o| *o < offset)
            .collect();
        for o in stale {
            self.remove_lease(o);
        }
        self.delayed.retain(|o, _| *o >= offset);
        self.delivery_counts.retain(|o, _| *o >= offset);
        self.parked = self.parked.split_off(&offset);
        self.held = self.held.split_off(&offset);
    }

    fn remove_lease(&mut self, offset: u64) {
        if let Some(lease) = self.leases.remove(&offset) {
            self.by_expiry.remove(&(lease.expires_at_ms, offset));
        }
    }

    /// Keeps `offset` in `held` exactly while it has a lease, a delay or a
    /// park entry, with the instant [`Self::is_available`] turns true; every
    /// change to those ends here.
    fn settle(&mut self, offset: u64) {
        // Each entry holds the offset back until an instant, or for good.
        let lease = self
            .leases
            .get(&offset)
            .map(|l| l.expires_at_ms.checked_add(1));
        let delay = self.delayed.get(&offset).map(|at| Some(*at));
        let park = self.parked.contains(&offset).then_some(None);
        let holds = [lease, delay, park];
        if holds.iter().all(Option::is_none) {
            self.held.remove(&offset);
        } else {
            let free_from = holds
                .into_iter()
                .flatten()
                .try_fold(0, |latest: u64, until| until.map(|u| latest.max(u)));
            self.held.insert(offset, free_from);
        }
    }
}

#[cfg(test)]
mod tests;

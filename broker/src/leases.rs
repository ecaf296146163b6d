//! The leases of one partition, held only in its owner's memory.
//!
//! Pure logic: time comes in as `now_ms`, acks come from the partition's
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
        Self {
            next_lease_id: 1,
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
mod tests {
    use super::*;
    use narad_storage::consumer::AckSet;
    use narad_storage::rng::SimRng;

    /// The definition `available` must keep: every offset from `from` up,
    /// one by one.
    fn scan(
        table: &LeaseTable,
        acks: &AckSet,
        from: u64,
        high_watermark: u64,
        max: usize,
        now_ms: u64,
    ) -> Vec<u64> {
        (from..high_watermark)
            .filter(|o| !acks.is_acked(*o) && table.is_available(*o, now_ms))
            .take(max)
            .collect()
    }

    /// `held` names every offset with an entry, and the instant it names
    /// is the one where `is_available` turns true.
    fn assert_held_is_exact(table: &LeaseTable, now_ms: u64) {
        let offsets: BTreeSet<u64> = table
            .leases
            .keys()
            .chain(table.delayed.keys())
            .chain(table.parked.iter())
            .copied()
            .collect();
        assert!(table.held.keys().eq(offsets.iter()), "{table:?}");
        for (offset, free_from) in &table.held {
            for at in now_ms.saturating_sub(100)..now_ms + 100 {
                assert_eq!(
                    free_from.is_some_and(|f| at >= f),
                    table.is_available(*offset, at),
                    "{offset} at {at}: {table:?}"
                );
            }
        }
    }

    /// Random tables built through the public operations, the way an owner
    /// drives them: leases with lapsed and live ends, nacks with and without
    /// delays, acks, parks, sweeps, take-backs and forgets, over a small span
    /// so that acked ranges, held runs and their edges meet often.
    #[test]
    fn available_matches_a_scan_of_every_offset_on_random_tables() {
        let mut rng = SimRng::new(0x1ea5e);
        for round in 0..2000 {
            let span = 1 + rng.below(48);
            let mut acks = AckSet::new(rng.below(4));
            let mut table = LeaseTable::new();
            let mut now = rng.below(100);
            let mut granted: Vec<(u64, u64)> = Vec::new();
            for _ in 0..rng.below(120) {
                now += rng.below(20);
                let offset = rng.below(span);
                match rng.below(10) {
                    0..=2 => {
                        if !acks.is_acked(offset) && table.is_available(offset, now) {
                            let lease = table.lease(offset, now, 1 + rng.below(80));
                            granted.push((offset, lease.lease_id));
                        }
                    }
                    3 => {
                        if let Some(&(o, id)) =
                            granted.get(rng.below(granted.len() as u64 + 1) as usize)
                        {
                            if table.ack(o, id, now).is_ok() {
                                acks.ack(o);
                            }
                        }
                    }
                    4 => {
                        if let Some(&(o, id)) =
                            granted.get(rng.below(granted.len() as u64 + 1) as usize)
                        {
                            let delay = if rng.chance(1, 2) { 0 } else { rng.below(60) };
                            let _ = table.nack(o, id, delay, now);
                        }
                    }
                    5 => {
                        if let Some(&(o, id)) =
                            granted.get(rng.below(granted.len() as u64 + 1) as usize)
                        {
                            if rng.chance(1, 2) {
                                table.unlease(o, id);
                            } else {
                                let _ = table.extend(o, id, rng.below(80), now);
                            }
                        }
                    }
                    6 => {
                        if rng.chance(1, 2) {
                            table.park(offset);
                        } else {
                            table.unpark(offset);
                        }
                    }
                    7 => {
                        table.sweep(now);
                    }
                    8 => {
                        // Acks from elsewhere (a dead-lettered message, an
                        // earlier owner): ranges with and without leases.
                        for o in offset..(offset + rng.below(6)).min(span) {
                            acks.ack(o);
                        }
                    }
                    _ => {
                        if rng.chance(1, 8) {
                            table.forget_below(acks.frontier().min(offset));
                        }
                    }
                }
            }
            assert_held_is_exact(&table, now);
            for _ in 0..20 {
                let from = if rng.chance(1, 2) {
                    acks.frontier()
                } else {
                    rng.below(span + 2)
                };
                let high_watermark = rng.below(span + 4);
                let max = rng.below(12) as usize;
                let at = now.saturating_sub(80) + rng.below(160);
                let expected = scan(&table, &acks, from, high_watermark, max, at);
                assert_eq!(
                    table.available(from, high_watermark, max, at, |o| acks.unacked_run(o)),
                    expected,
                    "round {round}: from {from} hwm {high_watermark} max {max} at {at}; {acks:?}; {table:?}"
                );
                // Runs cut short must not change the answer.
                let single = |o| {
                    let start = acks.next_unacked(o);
                    start..start + 1
                };
                assert_eq!(
                    table.available(from, high_watermark, max, at, single),
                    expected,
                    "round {round}, single-offset runs"
                );
            }
        }
    }

    #[test]
    fn a_stranded_lease_does_not_make_available_walk_the_acked_backlog() {
        let mut table = LeaseTable::new();
        table.lease(0, 0, u64::MAX / 2);
        table.lease(1 << 40, 0, u64::MAX / 2);
        let acked_to = (1 << 40) + 5;
        // Offsets 1 to 2^40 + 4 are acked but for 2^40, which is leased: a
        // scan of them would never finish.
        let unacked_run = |o: u64| {
            if o == 0 {
                0..1
            } else if (1..1 << 40).contains(&o) {
                1 << 40..(1 << 40) + 1
            } else if ((1 << 40) + 1..acked_to).contains(&o) {
                acked_to..u64::MAX
            } else {
                o..u64::MAX
            }
        };
        assert_eq!(
            table.available(0, u64::MAX, 3, 1, unacked_run),
            vec![acked_to, acked_to + 1, acked_to + 2]
        );
        assert_eq!(
            table.available(0, acked_to + 1, 3, 1, unacked_run),
            vec![acked_to]
        );
        assert_eq!(
            table.available(0, acked_to, 3, 1, unacked_run),
            Vec::<u64>::new()
        );
        assert_eq!(
            table.available(0, u64::MAX, 2, u64::MAX / 2 + 1, unacked_run),
            vec![0, 1 << 40],
            "lapsed leases are available before a sweep"
        );
    }

    #[test]
    fn a_leased_message_is_not_delivered_again_until_its_lease_ends() {
        let mut table = LeaseTable::new();
        assert_eq!(
            table.available(0, 3, 10, 1000, |o| o..u64::MAX),
            vec![0, 1, 2]
        );
        let lease = table.lease(0, 1000, 500);
        assert_eq!((lease.expires_at_ms, lease.delivery_count), (1500, 1));
        assert_eq!(table.available(0, 3, 10, 1000, |o| o..u64::MAX), vec![1, 2]);
        assert_eq!(
            table.available(0, 3, 10, 1500, |o| o..u64::MAX),
            vec![1, 2],
            "still leased at its last instant"
        );
        assert_eq!(
            table.available(0, 3, 10, 1501, |o| o..u64::MAX),
            vec![0, 1, 2],
            "ended even before a sweep"
        );
        assert_eq!(
            table.ack(0, lease.lease_id, 1501),
            Err(LeaseGone),
            "a late ack is 410"
        );
        let again = table.lease(0, 1501, 500);
        assert_eq!(again.delivery_count, 2);
        assert_ne!(again.lease_id, lease.lease_id);
    }

    #[test]
    fn ack_ends_the_lease_for_good_and_a_second_ack_is_gone() {
        let mut table = LeaseTable::new();
        let lease = table.lease(7, 0, 100);
        assert_eq!(table.ack(7, lease.lease_id, 50), Ok(()));
        assert_eq!(table.ack(7, lease.lease_id, 50), Err(LeaseGone));
        assert_eq!(
            table.available(7, 8, 10, 60, |o| o.max(8)..u64::MAX),
            Vec::<u64>::new()
        );
        assert_eq!(table.in_flight(60), 0);
    }

    #[test]
    fn nack_releases_at_once_or_after_its_delay() {
        let mut table = LeaseTable::new();
        let first = table.lease(1, 0, 1000);
        table.nack(1, first.lease_id, 0, 10).expect("nack");
        assert!(table.is_available(1, 10));
        let second = table.lease(1, 10, 1000);
        table
            .nack(1, second.lease_id, 200, 20)
            .expect("nack with delay");
        assert!(!table.is_available(1, 219));
        assert!(table.is_available(1, 220));
        assert_eq!(
            table.nack(1, second.lease_id, 0, 30),
            Err(LeaseGone),
            "the receipt died with the nack"
        );
    }

    #[test]
    fn extend_moves_the_end_and_keeps_the_receipt_valid() {
        let mut table = LeaseTable::new();
        let lease = table.lease(3, 0, 100);
        assert_eq!(table.extend(3, lease.lease_id, 1000, 90), Ok(1090));
        assert!(table.check(3, lease.lease_id, 500).is_ok());
        assert_eq!(table.sweep(500), vec![]);
        assert_eq!(
            table.sweep(1091),
            vec![Expired {
                offset: 3,
                delivery_count: 1
            }]
        );
        assert_eq!(table.extend(3, lease.lease_id, 1000, 1091), Err(LeaseGone));
    }

    #[test]
    fn sweep_returns_ended_leases_with_their_delivery_counts() {
        let mut table = LeaseTable::new();
        table.lease(1, 0, 10);
        table.lease(2, 0, 20);
        table.lease(3, 0, 30);
        assert_eq!(table.in_flight(15), 2);
        let ended = table.sweep(25);
        assert_eq!(
            ended.iter().map(|e| e.offset).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(table.in_flight(25), 1);
    }

    #[test]
    fn parked_offsets_are_held_back_and_forget_below_drops_state() {
        let mut table = LeaseTable::new();
        table.park(4);
        assert!(!table.is_available(4, 0));
        table.unpark(4);
        assert!(table.is_available(4, 0));
        table.lease(2, 0, 100);
        table.lease(9, 0, 100);
        table.forget_below(5);
        assert_eq!(table.delivery_count(2), 0);
        assert_eq!(table.delivery_count(9), 1);
        assert_eq!(table.in_flight(0), 1);
    }

    #[test]
    fn a_lease_taken_back_is_available_at_once_and_not_counted() {
        let mut table = LeaseTable::new();
        let first = table.lease(4, 0, 30_000);
        table.unlease(4, first.lease_id);
        assert!(table.is_available(4, 1), "not hidden for the visibility");
        assert_eq!(table.delivery_count(4), 0, "a delivery nobody received");
        let second = table.lease(4, 2, 30_000);
        assert_eq!(second.delivery_count, 1);
        table.unlease(4, first.lease_id);
        assert!(
            !table.is_available(4, 3),
            "an older lease id takes nothing back"
        );
    }
}

//! Tests of [`super`].

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

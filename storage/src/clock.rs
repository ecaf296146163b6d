//! Time enters the engine only through [`Clock`], so retention, leases
//! and flush intervals can be tested without waiting, and a simulation can
//! step a node's wall clock apart from its monotonic one.
//!
//! Two readings, never mixed: the wall clock ([`Clock::now_ms`], Unix
//! milliseconds) for times that are kept or shown (a message's
//! `produced_at_ms`, a segment's age for retention, metastore records),
//! and the monotonic clock ([`Clock::mono_ms`]) for every duration the
//! process measures and does not keep (leases, waits, deadlines, retry
//! and reroute timers). A step of the wall clock (NTP, an operator)
//! changes none of the durations; only differences of monotonic readings
//! mean anything, and they never survive a restart.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Where a process's monotonic milliseconds start: far from any wall
/// time, so a reading taken for the other kind shows at once.
pub const MONO_ORIGIN_MS: u64 = 86_400_000;

pub trait Clock {
    /// Milliseconds since the Unix epoch (may step).
    fn now_ms(&self) -> u64;
    /// Milliseconds on a clock that never steps, from [`MONO_ORIGIN_MS`]
    /// at some instant of this process.
    fn mono_ms(&self) -> u64;
    /// Both readings at once.
    fn now(&self) -> Now {
        Now {
            wall_ms: self.now_ms(),
            mono_ms: self.mono_ms(),
        }
    }
}

/// The two clocks read together, for code that both measures durations
/// and records times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub wall_ms: u64,
    pub mono_ms: u64,
}

impl Now {
    /// Both clocks reading `ms` (tests, and a simulation that never steps).
    pub fn at(ms: u64) -> Self {
        Self {
            wall_ms: ms,
            mono_ms: ms,
        }
    }

    /// The wall time of the monotonic instant `mono_ms` (later or
    /// earlier than now), as answers show a lease's end.
    pub fn wall_of(&self, mono_ms: u64) -> u64 {
        if mono_ms >= self.mono_ms {
            self.wall_ms.saturating_add(mono_ms - self.mono_ms)
        } else {
            self.wall_ms.saturating_sub(self.mono_ms - mono_ms)
        }
    }
}

/// The system's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

fn process_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    fn mono_ms(&self) -> u64 {
        let elapsed = process_start().elapsed().as_millis();
        MONO_ORIGIN_MS.saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to; clones share one time. Time that
/// passes moves both readings; [`ManualClock::step_wall_ms`] moves the wall
/// clock alone, as NTP steps it.
#[derive(Debug, Default, Clone)]
pub struct ManualClock {
    now_ms: Rc<Cell<u64>>,
    mono_ms: Rc<Cell<u64>>,
}

impl ManualClock {
    /// Both readings start at `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now_ms: Rc::new(Cell::new(start_ms)),
            mono_ms: Rc::new(Cell::new(start_ms)),
        }
    }
    pub fn advance_ms(&self, delta_ms: u64) {
        self.now_ms.set(self.now_ms.get().saturating_add(delta_ms));
        self.mono_ms
            .set(self.mono_ms.get().saturating_add(delta_ms));
    }
    /// Time passes until the monotonic clock reads `mono_ms` (never back).
    pub fn set_ms(&self, mono_ms: u64) {
        self.advance_ms(mono_ms.saturating_sub(self.mono_ms.get()));
    }
    /// The wall clock jumps by `delta_ms` (back when negative); the
    /// monotonic clock does not move.
    pub fn step_wall_ms(&self, delta_ms: i64) {
        let wall = self.now_ms.get();
        self.now_ms.set(if delta_ms >= 0 {
            wall.saturating_add(delta_ms.unsigned_abs())
        } else {
            wall.saturating_sub(delta_ms.unsigned_abs())
        });
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.get()
    }
    fn mono_ms(&self) -> u64 {
        self.mono_ms.get()
    }
}

/// The clock handle the engine keeps.
pub type SharedClock = Rc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_step_moves_no_monotonic_reading() {
        let clock = ManualClock::new(1_000);
        clock.advance_ms(500);
        assert_eq!(clock.now(), Now::at(1_500));
        clock.step_wall_ms(-600_000);
        assert_eq!((clock.now_ms(), clock.mono_ms()), (0, 1_500));
        clock.step_wall_ms(600_000);
        clock.set_ms(2_000);
        assert_eq!((clock.now_ms(), clock.mono_ms()), (600_500, 2_000));
        // Never back.
        clock.set_ms(10);
        assert_eq!(clock.mono_ms(), 2_000);
    }

    #[test]
    fn a_monotonic_instant_is_shown_on_the_wall_clock() {
        let now = Now {
            wall_ms: 1_700_000_000_000,
            mono_ms: MONO_ORIGIN_MS + 5,
        };
        assert_eq!(now.wall_of(MONO_ORIGIN_MS + 20_005), 1_700_000_020_000);
        assert_eq!(now.wall_of(MONO_ORIGIN_MS), 1_699_999_999_995);
    }

    #[test]
    fn the_system_clocks_are_far_apart_and_the_monotonic_one_moves_on() {
        let clock = SystemClock;
        let first = clock.mono_ms();
        assert!(first >= MONO_ORIGIN_MS && first < clock.now_ms() / 1_000);
        assert!(clock.mono_ms() >= first);
    }
}

//! The newest epoch this node has seen for each idempotent producer id, so
//! that a record of an older epoch is refused (`INVALID_PRODUCER_EPOCH`),
//! never stored, as Kafka refuses it.
//!
//! A producer's sequences are numbered per (producer id, epoch): a client
//! that timed out on records bumps its epoch (librdkafka and the Java
//! client do it locally; KIP-360 asks `InitProducerId` for it) and counts
//! from 0 again. The epoch is in each record's idempotency key
//! ([`super::records`]), so the new sequence space is never taken for
//! retries of the old; this table keeps the old epoch's stragglers out.
//!
//! Bounded by [`KAFKA_PRODUCER_EPOCHS_MAX`] ids in two generations: when
//! the newer one is full, the older is forgotten. An id forgotten that way
//! (or by a restart) has not produced here for a long time; what it loses
//! is only the fence, never a record (the keys still tell epochs apart).
//! Node-wide: a producer's connections may land on any shard.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::limits::KAFKA_PRODUCER_EPOCHS_MAX;

/// A record's producer epoch is older than one this node has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("producer {id} sends epoch {sent}, older than its epoch {newest} seen here")]
pub struct StaleEpoch {
    pub id: i64,
    pub sent: i16,
    pub newest: i16,
}

#[derive(Debug, Default)]
struct Generations {
    current: HashMap<i64, i16>,
    previous: HashMap<i64, i16>,
}

impl Generations {
    fn newest(&self, id: i64) -> Option<i16> {
        self.current
            .get(&id)
            .or_else(|| self.previous.get(&id))
            .copied()
    }

    fn set(&mut self, id: i64, epoch: i16, per_generation: usize) {
        if !self.current.contains_key(&id) && self.current.len() >= per_generation {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(id, epoch);
    }
}

/// The newest epoch of each producer id seen on this node.
#[derive(Debug)]
pub struct ProducerEpochs {
    per_generation: usize,
    seen: Mutex<Generations>,
}

impl Default for ProducerEpochs {
    fn default() -> Self {
        Self::with_capacity(KAFKA_PRODUCER_EPOCHS_MAX)
    }
}

impl ProducerEpochs {
    /// A table that remembers at least `ids / 2` and at most `ids` ids.
    pub fn with_capacity(ids: usize) -> Self {
        Self {
            per_generation: (ids / 2).max(1),
            seen: Mutex::new(Generations::default()),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Generations> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes records of `id` in `epoch`: refused when a newer epoch of the
    /// id was seen, else `epoch` becomes the newest if it is.
    pub fn admit(&self, id: i64, epoch: i16) -> Result<(), StaleEpoch> {
        let mut seen = self.seen();
        match seen.newest(id) {
            Some(newest) if newest > epoch => Err(StaleEpoch {
                id,
                sent: epoch,
                newest,
            }),
            _ => {
                // Also a producer still at its newest epoch: kept among the
                // newer generation, so a busy producer keeps its fence.
                seen.set(id, epoch, self.per_generation);
                Ok(())
            }
        }
    }

    /// `InitProducerId` with an id and its epoch (KIP-360): the next epoch,
    /// now the newest; `None` when the epoch has no next (the caller gives
    /// a new id). A retry of a bump whose answer was lost gets the same
    /// epoch again; one from further behind is refused (another instance
    /// of the producer moved on).
    pub fn bump(&self, id: i64, epoch: i16) -> Result<Option<i16>, StaleEpoch> {
        let mut seen = self.seen();
        match seen.newest(id) {
            Some(newest) if epoch.checked_add(1) == Some(newest) => return Ok(Some(newest)),
            Some(newest) if newest > epoch => {
                return Err(StaleEpoch {
                    id,
                    sent: epoch,
                    newest,
                })
            }
            _ => {}
        }
        // Kafka keeps the last epoch (i16::MAX) unused: a new id instead.
        let next = epoch.checked_add(1).filter(|next| *next < i16::MAX);
        if let Some(next) = next {
            seen.set(id, next, self.per_generation);
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_epoch_is_refused_once_a_newer_one_was_seen() {
        let epochs = ProducerEpochs::default();
        assert_eq!(epochs.admit(7, 0), Ok(()));
        assert_eq!(epochs.admit(7, 0), Ok(()));
        assert_eq!(epochs.admit(7, 1), Ok(()));
        assert_eq!(
            epochs.admit(7, 0),
            Err(StaleEpoch {
                id: 7,
                sent: 0,
                newest: 1
            })
        );
        assert_eq!(epochs.admit(7, 1), Ok(()));
        // Another id is its own.
        assert_eq!(epochs.admit(8, 0), Ok(()));
    }

    #[test]
    fn a_bump_answers_the_next_epoch_and_fences_the_one_before() {
        let epochs = ProducerEpochs::default();
        assert_eq!(epochs.admit(3, 4), Ok(()));
        assert_eq!(epochs.bump(3, 4), Ok(Some(5)));
        assert!(epochs.admit(3, 4).is_err());
        assert_eq!(epochs.admit(3, 5), Ok(()));
        // The same bump again (its answer was lost): the same epoch.
        assert_eq!(epochs.bump(3, 4), Ok(Some(5)));
        // From further behind: another instance of the producer, fenced.
        assert_eq!(epochs.bump(3, 5), Ok(Some(6)));
        assert!(epochs.bump(3, 4).is_err());
        // The last epoch has no next: the caller gives a new id.
        assert_eq!(epochs.bump(9, i16::MAX - 1), Ok(None));
        // An id never seen here bumps from what the client holds.
        assert_eq!(epochs.bump(11, 0), Ok(Some(1)));
    }

    #[test]
    fn the_table_holds_its_bound_and_forgets_the_oldest_generation() {
        let epochs = ProducerEpochs::with_capacity(4);
        for id in 0..1_000 {
            epochs.admit(id, 1).expect("new id");
            let seen = epochs.seen();
            assert!(seen.current.len() + seen.previous.len() <= 4);
        }
        // The newest ids are remembered, and fenced.
        assert!(epochs.admit(999, 0).is_err());
        assert!(epochs.admit(998, 0).is_err());
        // Long forgotten: only the fence is lost.
        assert_eq!(epochs.admit(0, 0), Ok(()));
    }
}

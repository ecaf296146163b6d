//! Which topic folders of this node are in use, so that a deleted topic's
//! folder is removed only once nothing writes in it any more.
//!
//! A partition owner (and a move's copy) holds its topic's folder for as
//! long as it lives: the hold goes with the last reference to the owner,
//! which an append under way keeps, so the owner's last append (which may
//! roll a segment, creating a file) is done before the folder can go.
//! Shard 0 reaps a deleted topic's folder only when no shard holds it, and
//! while it reaps, nothing may take it again (an owner opening for a topic
//! this shard does not yet know is deleted is refused). A hold released on
//! a folder the reaper passed over wakes the reaper. Node-wide: any shard
//! may own a partition.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_channel::mpsc::UnboundedSender;

/// A topic's folder: its name and incarnation.
type Folder = (String, u64);

/// The node's topic folders in use and being reaped.
#[derive(Debug, Default)]
pub struct TopicFolders {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Holds per folder (no entry once none is left).
    holds: HashMap<Folder, usize>,
    /// Folders being removed: nobody may hold them.
    reaping: HashSet<Folder>,
    /// Folders the reaper passed over because they were held.
    deferred: HashSet<Folder>,
    /// Wakes the reaper once a deferred folder is free.
    reaper: Option<UnboundedSender<()>>,
}

impl TopicFolders {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds the folder of `topic`'s `incarnation`; `None` while it is being
    /// removed (the topic was deleted).
    pub fn hold(self: &Arc<Self>, topic: &str, incarnation: u64) -> Option<FolderHold> {
        let folder = (topic.to_string(), incarnation);
        let mut state = self.state();
        if state.reaping.contains(&folder) {
            return None;
        }
        *state.holds.entry(folder.clone()).or_default() += 1;
        Some(FolderHold {
            folders: self.clone(),
            folder,
        })
    }

    /// Starts removing a folder: `None` while something holds it (the
    /// reaper is woken once it is free) or another reap of it is under way.
    pub fn reap(self: &Arc<Self>, topic: &str, incarnation: u64) -> Option<Reaping> {
        let folder = (topic.to_string(), incarnation);
        let mut state = self.state();
        if state.reaping.contains(&folder) {
            return None;
        }
        if state.holds.contains_key(&folder) {
            state.deferred.insert(folder);
            return None;
        }
        state.deferred.remove(&folder);
        state.reaping.insert(folder.clone());
        Some(Reaping {
            folders: self.clone(),
            folder,
        })
    }

    /// Where to wake the reaper (shard 0's).
    pub fn wake_reaper_with(&self, reaper: UnboundedSender<()>) {
        self.state().reaper = Some(reaper);
    }

    fn release(&self, folder: &Folder) {
        let mut state = self.state();
        let Some(count) = state.holds.get_mut(folder) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        state.holds.remove(folder);
        if state.deferred.remove(folder) {
            if let Some(reaper) = &state.reaper {
                // A reaper gone (the node stops) has nothing left to do.
                let _ = reaper.unbounded_send(());
            }
        }
    }
}

/// A topic's folder in use; released when dropped.
#[derive(Debug)]
pub struct FolderHold {
    folders: Arc<TopicFolders>,
    folder: Folder,
}

impl Drop for FolderHold {
    fn drop(&mut self) {
        self.folders.release(&self.folder);
    }
}

/// A folder being removed; others may hold it again once this is dropped
/// (by then the topic's metadata says it is gone, so nothing opens it).
#[derive(Debug)]
pub struct Reaping {
    folders: Arc<TopicFolders>,
    folder: Folder,
}

impl Drop for Reaping {
    fn drop(&mut self) {
        self.folders.state().reaping.remove(&self.folder);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[test]
    fn a_held_folder_is_reaped_only_once_released_and_a_reaped_one_is_not_held() {
        let folders = Arc::new(TopicFolders::default());
        let (wake, mut woken) = futures_channel::mpsc::unbounded();
        folders.wake_reaper_with(wake);
        let first = folders.hold("t", 1).expect("hold");
        let second = folders.hold("t", 1).expect("hold again");
        assert!(folders.reap("t", 1).is_none(), "held twice");
        drop(first);
        assert!(woken.try_recv().is_err(), "still held: no wake");
        assert!(folders.reap("t", 1).is_none(), "still held once");
        drop(second);
        assert_eq!(
            futures_lite::future::block_on(woken.next()),
            Some(()),
            "the reaper is woken once the folder it passed over is free"
        );
        let reaping = folders.reap("t", 1).expect("free");
        assert!(folders.hold("t", 1).is_none(), "refused while reaped");
        assert!(folders.hold("t", 2).is_some(), "another incarnation");
        drop(reaping);
        assert!(folders.hold("t", 1).is_some());
    }
}

//! A deterministic single-threaded executor on a manual clock: tasks run in
//! an order drawn from the seed, timers fire when nothing else can run (the
//! clock jumps to the next one), and every task belongs to a group (one
//! start of one node) that a crash drops whole.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use narad_broker::runtime::{BlockingWork, LocalFuture, Runtime};
use narad_storage::clock::{Clock, ManualClock};
use narad_storage::rng::SimRng;

/// A start of a node (or the clients): its tasks live and die together.
pub type Group = u64;

/// Steps (a round of ready tasks, or a timer fired) one run may take: a
/// run past it is stuck (tasks that wake each other for ever without the
/// clock moving on), and fails instead of hanging. About 50 times the most
/// a passing seed took (97,014 in the default run's 1,603 seeds; the
/// median 40,063): from a few seconds to half a minute of a debug build.
pub const STEPS_MAX: u64 = 5_000_000;

struct Task {
    group: Group,
    future: LocalFuture,
}

struct TaskWaker {
    id: u64,
    ready: Arc<Mutex<Vec<u64>>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Ok(mut ready) = self.ready.lock() {
            ready.push(self.id);
        }
    }
}

pub struct Executor {
    pub clock: Rc<ManualClock>,
    tasks: RefCell<BTreeMap<u64, Task>>,
    next_id: Cell<u64>,
    ready: Arc<Mutex<Vec<u64>>>,
    timers: RefCell<BTreeMap<(u64, u64), Waker>>,
    next_timer: Cell<u64>,
    alive: RefCell<BTreeSet<Group>>,
    next_group: Cell<Group>,
    rng: RefCell<SimRng>,
    /// The run's seed, for the message of a run that is stuck.
    seed: u64,
    steps: Cell<u64>,
}

impl Executor {
    pub fn new(seed: u64, start_ms: u64) -> Rc<Self> {
        Rc::new(Self {
            clock: Rc::new(ManualClock::new(start_ms)),
            tasks: RefCell::default(),
            next_id: Cell::new(1),
            ready: Arc::default(),
            timers: RefCell::default(),
            next_timer: Cell::new(1),
            alive: RefCell::default(),
            next_group: Cell::new(1),
            rng: RefCell::new(SimRng::new(seed ^ 0x0E8E_C0DE)),
            seed,
            steps: Cell::new(0),
        })
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.mono_ms()
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps.get()
    }

    /// A new group of tasks.
    pub fn group(&self) -> Group {
        let group = self.next_group.get();
        self.next_group.set(group + 1);
        self.alive.borrow_mut().insert(group);
        group
    }

    /// Drops every task of `group` (a crash): their futures are dropped as
    /// a dying process would leave them.
    pub fn kill(&self, group: Group) {
        self.alive.borrow_mut().remove(&group);
        let dead: Vec<Task> = {
            let mut tasks = self.tasks.borrow_mut();
            let ids: Vec<u64> = tasks
                .iter()
                .filter(|(_, t)| t.group == group)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter().filter_map(|id| tasks.remove(&id)).collect()
        };
        drop(dead);
    }

    /// Drops every task and timer: the tasks hold the shards, which hold
    /// this executor, so a run that ends must break that circle.
    pub fn shut_down(&self) {
        self.alive.borrow_mut().clear();
        let tasks = std::mem::take(&mut *self.tasks.borrow_mut());
        drop(tasks);
        let timers = std::mem::take(&mut *self.timers.borrow_mut());
        drop(timers);
    }

    pub fn spawn(&self, group: Group, future: LocalFuture) {
        if !self.alive.borrow().contains(&group) {
            return;
        }
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        self.tasks.borrow_mut().insert(id, Task { group, future });
        if let Ok(mut ready) = self.ready.lock() {
            ready.push(id);
        }
    }

    /// Runs ready tasks in a seeded order; when none is ready, moves the
    /// clock to the next timer. Returns false once nothing can happen.
    pub fn step(&self) -> bool {
        let mut ready: Vec<u64> = match self.ready.lock() {
            Ok(mut ready) => std::mem::take(&mut *ready),
            Err(_) => Vec::new(),
        };
        ready.sort_unstable();
        ready.dedup();
        if ready.is_empty() {
            return self.fire_next_timer();
        }
        // A seeded shuffle: interleavings differ from seed to seed.
        {
            let mut rng = self.rng.borrow_mut();
            for i in (1..ready.len()).rev() {
                let j = usize::try_from(rng.below(i as u64 + 1)).unwrap_or(0);
                ready.swap(i, j);
            }
        }
        for id in ready {
            let Some(mut task) = self.tasks.borrow_mut().remove(&id) else {
                continue;
            };
            let waker = Waker::from(Arc::new(TaskWaker {
                id,
                ready: self.ready.clone(),
            }));
            let mut cx = Context::from_waker(&waker);
            if task.future.as_mut().poll(&mut cx).is_pending()
                && self.alive.borrow().contains(&task.group)
            {
                self.tasks.borrow_mut().insert(id, task);
            }
        }
        true
    }

    fn fire_next_timer(&self) -> bool {
        let Some((deadline, _)) = self.timers.borrow().keys().next().copied() else {
            return false;
        };
        if deadline > self.clock.mono_ms() {
            self.clock.set_ms(deadline);
        }
        let now = self.clock.mono_ms();
        let due: Vec<Waker> = {
            let mut timers = self.timers.borrow_mut();
            let later = timers.split_off(&(now + 1, 0));
            std::mem::replace(&mut *timers, later)
                .into_values()
                .collect()
        };
        for waker in due {
            waker.wake();
        }
        true
    }

    /// Runs until `done` holds or the clock passes `until_ms`; returns
    /// whether `done` held. Panics, naming the seed, once the run took
    /// [`STEPS_MAX`] steps.
    pub fn run_until(&self, until_ms: u64, mut done: impl FnMut() -> bool) -> bool {
        loop {
            if done() {
                return true;
            }
            if self.clock.mono_ms() > until_ms {
                return false;
            }
            let steps = self.steps.get() + 1;
            self.steps.set(steps);
            assert!(
                steps <= STEPS_MAX,
                "seed {seed}: the run took {STEPS_MAX} executor steps and is still at {now} ms \
                 (tasks waking each other without end?); replay with NARAD_SIM_SEED={seed} \
                 NARAD_SIM_ITERATIONS=1 cargo test -p narad-broker --test simulation",
                seed = self.seed,
                now = self.clock.mono_ms(),
            );
            if !self.step() {
                return done();
            }
        }
    }

    pub fn sleep(self: &Rc<Self>, duration: Duration) -> Sleep {
        let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX / 4);
        let ms = if duration.is_zero() { 0 } else { ms.max(1) };
        Sleep {
            executor: self.clone(),
            deadline: self.clock.mono_ms().saturating_add(ms),
            key: None,
        }
    }
}

/// Completes once the manual clock reaches its deadline.
pub struct Sleep {
    executor: Rc<Executor>,
    deadline: u64,
    key: Option<(u64, u64)>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.executor.clock.mono_ms() >= self.deadline {
            if let Some(key) = self.key.take() {
                self.executor.timers.borrow_mut().remove(&key);
            }
            return Poll::Ready(());
        }
        let key = match self.key {
            Some(key) => key,
            None => {
                let seq = self.executor.next_timer.get();
                self.executor.next_timer.set(seq + 1);
                let key = (self.deadline, seq);
                self.key = Some(key);
                key
            }
        };
        self.executor
            .timers
            .borrow_mut()
            .insert(key, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.executor.timers.borrow_mut().remove(&key);
        }
    }
}

/// The broker's time-and-tasks seam for one group.
pub struct SimRuntime {
    pub executor: Rc<Executor>,
    pub group: Group,
}

impl Runtime for SimRuntime {
    fn sleep(&self, duration: Duration) -> LocalFuture {
        Box::pin(self.executor.sleep(duration))
    }

    fn spawn(&self, task: LocalFuture) {
        self.executor.spawn(self.group, task);
    }

    /// Runs the work at once, on the simulation's one thread.
    fn blocking(&self, work: BlockingWork) -> LocalFuture {
        work();
        Box::pin(std::future::ready(()))
    }
}

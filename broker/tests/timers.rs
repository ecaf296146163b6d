//! The shards' timers, on the glommio reactor Narad builds
//! (`third_party/glommio`, patched): a short sleep always wakes, while other
//! work wakes the executor at any moment and the CPU is contended. A timer
//! whose wakeup is lost leaves its task parked until something else wakes
//! the executor: a lease that expires late, a linger that holds a batch, a
//! throttled copy that stops (each seen before the reactor was fixed).

use std::net::UdpSocket as StdUdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::net::UdpSocket;
use glommio::timer::sleep;
use glommio::{LocalExecutorBuilder, Placement};

/// Executors, each with a sleeper and a socket something else writes to.
const EXECUTORS: usize = 4;
/// Threads that only burn CPU, so that the reactors are descheduled at any
/// point of their turn.
const BURNERS: usize = 2;
const RUN_FOR: Duration = Duration::from_secs(8);
/// How short the sleeps are.
const SLEEP: Duration = Duration::from_millis(1);
/// A sleep this long was lost, not late: a runnable thread here waits for a
/// core far less, and a lost wakeup waits for the reactor's next preemption
/// timer (100 ms) or for good.
const LOST_AFTER: Duration = Duration::from_millis(60);
/// Datagrams in a burst, then a pause with nothing but the timers to wake
/// the executor (where a lost wakeup shows).
const BURST: u32 = 30;
const PAUSE: Duration = Duration::from_millis(150);

/// A small xorshift, so that gaps differ from burst to burst.
struct Gaps(u64);

impl Gaps {
    fn micros(&mut self, below: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_micros(20 + self.0 % below)
    }
}

/// Sends bursts of datagrams to `to` until `stop`.
fn bursts(to: std::net::SocketAddr, seed: u64, stop: Arc<AtomicBool>) {
    let socket = StdUdpSocket::bind("127.0.0.1:0").expect("bind a sender");
    let mut gaps = Gaps(seed);
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..BURST {
            std::thread::sleep(gaps.micros(400));
            let _ = socket.send_to(b"wake", to);
        }
        std::thread::sleep(PAUSE);
    }
}

/// Sleeps of [`SLEEP`] for [`RUN_FOR`] on one executor while datagrams
/// arrive on its socket: how many, and each one that took [`LOST_AFTER`]
/// or more.
fn sleeper(index: usize, stop: Arc<AtomicBool>) -> (u64, Vec<Duration>) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .name(&format!("timers-{index}"))
        .spawn(move || async move {
            let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
            let to = socket.local_addr().expect("address");
            let sender = {
                let stop = stop.clone();
                std::thread::spawn(move || bursts(to, 0x9e37_79b9 + index as u64, stop))
            };
            let receiver = glommio::spawn_local(async move {
                let mut buffer = [0u8; 16];
                loop {
                    let _ = socket.recv_from(&mut buffer).await;
                }
            })
            .detach();
            let started = Instant::now();
            let (mut count, mut lost) = (0u64, Vec::new());
            while started.elapsed() < RUN_FOR {
                let asleep = Instant::now();
                sleep(SLEEP).await;
                let took = asleep.elapsed();
                count += 1;
                if took >= LOST_AFTER {
                    lost.push(took);
                }
            }
            stop.store(true, Ordering::Relaxed);
            receiver.cancel();
            let _ = sender.join();
            (count, lost)
        })
        .expect("an executor")
        .join()
        .expect("the executor ran")
}

/// A datagram wakes an executor whose only timer is far off, and the task
/// it wakes runs at once: each of a stream of datagrams, sent far enough
/// apart that the executor sleeps between them, is received well within
/// [`LOST_AFTER`] of being sent.
#[test]
fn a_task_woken_while_the_next_timer_is_far_off_runs_at_once() {
    const DATAGRAMS: u32 = 60;
    // Far beyond the reactor's preemption period (100 ms), and short enough
    // that a failing run ends.
    const FAR: Duration = Duration::from_secs(20);
    let started = Instant::now();
    let receiving = LocalExecutorBuilder::new(Placement::Unbound)
        .name("timers-far")
        .spawn(move || async move {
            // The only timer.
            let far = glommio::spawn_local(sleep(FAR)).detach();
            let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
            let to = socket.local_addr().expect("address");
            let sender = std::thread::spawn(move || {
                let socket = StdUdpSocket::bind("127.0.0.1:0").expect("bind a sender");
                let mut gaps = Gaps(0x5851_f42d);
                for _ in 0..DATAGRAMS {
                    std::thread::sleep(Duration::from_millis(20) + gaps.micros(30_000));
                    let sent = started.elapsed().as_micros() as u64;
                    let _ = socket.send_to(&sent.to_le_bytes(), to);
                }
            });
            let mut late = Vec::new();
            let mut buffer = [0u8; 8];
            for _ in 0..DATAGRAMS {
                let (n, _) = socket.recv_from(&mut buffer).await.expect("a datagram");
                assert_eq!(n, 8);
                let sent = Duration::from_micros(u64::from_le_bytes(buffer));
                let took = started.elapsed().saturating_sub(sent);
                if took >= LOST_AFTER {
                    late.push(took);
                }
            }
            far.cancel();
            let _ = sender.join();
            late
        })
        .expect("an executor");
    let late = receiving.join().expect("the executor ran");
    assert!(
        late.is_empty(),
        "{} of {DATAGRAMS} datagrams waited {LOST_AFTER:?} or more for their task: {late:?}",
        late.len()
    );
}

#[test]
fn short_sleeps_always_wake_while_other_work_wakes_the_reactor_under_contention() {
    let stop = Arc::new(AtomicBool::new(false));
    let burners: Vec<_> = (0..BURNERS)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut spins = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    spins = std::hint::black_box(spins.wrapping_add(1));
                }
            })
        })
        .collect();
    let sleepers: Vec<_> = (0..EXECUTORS)
        .map(|index| {
            let stop = stop.clone();
            std::thread::spawn(move || sleeper(index, stop))
        })
        .collect();
    let results: Vec<(u64, Vec<Duration>)> = sleepers
        .into_iter()
        .map(|s| s.join().expect("a sleeper"))
        .collect();
    stop.store(true, Ordering::Relaxed);
    for burner in burners {
        let _ = burner.join();
    }
    let slept: u64 = results.iter().map(|(count, _)| count).sum();
    let lost: Vec<Duration> = results.into_iter().flat_map(|(_, lost)| lost).collect();
    // Enough turns that the old reactor lost several (about one sleep in
    // 2,000 under this load).
    assert!(slept > 5_000, "only {slept} sleeps in {RUN_FOR:?}");
    assert!(
        lost.is_empty(),
        "{} of {slept} sleeps of {SLEEP:?} took {LOST_AFTER:?} or more: {lost:?}",
        lost.len()
    );
}

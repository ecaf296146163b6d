//! The node's helper threads outside the shards (the peer endpoint, the
//! metastore, the remote children's shipper) each run a current-thread
//! tokio runtime of their own on a named thread, and their starter waits
//! until the thread says it is ready (bound, booted) or failed. This is
//! that pattern, once.

use std::future::Future;
use std::sync::mpsc;

/// What the thread's main future sends its starter, once: that it is ready
/// (and what the starter needs of it), or why it is not.
pub struct Ready<T> {
    sender: mpsc::Sender<Result<T, StartError>>,
}

impl<T> Ready<T> {
    /// Wakes the starter with `value`. A starter that gave up waiting is
    /// not an error: the value is dropped.
    pub fn send(self, value: T) {
        let _ = self.sender.send(Ok(value));
    }
}

/// Why a helper thread did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// The thread could not be spawned, or its runtime built.
    Thread(String),
    /// The thread ended without saying it was ready (its main future
    /// returned or panicked first).
    Ended,
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Thread(error) => write!(f, "{error}"),
            StartError::Ended => write!(f, "the thread ended before it was ready"),
        }
    }
}

impl std::error::Error for StartError {}

/// Starts a thread called `name` that runs `main` to its end on a
/// current-thread tokio runtime (timers and I/O enabled), and waits until
/// `main` sends through its [`Ready`]; returns what it sent, and the
/// thread (to join once told to stop).
pub fn start<T, F, Fut>(name: &str, main: F) -> Result<(T, std::thread::JoinHandle<()>), StartError>
where
    T: Send + 'static,
    F: FnOnce(Ready<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (sender, ready) = mpsc::channel::<Result<T, StartError>>();
    let thread = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = sender.send(Err(StartError::Thread(format!(
                        "building the runtime: {error}"
                    ))));
                    return;
                }
            };
            runtime.block_on(main(Ready { sender }));
        })
        .map_err(|e| StartError::Thread(format!("spawning {name}: {e}")))?;
    // Nothing to receive once `main` dropped its `Ready` unsent.
    let value = ready.recv().map_err(|_| StartError::Ended)??;
    Ok((value, thread))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_starter_gets_what_the_thread_sent_once_ready_and_the_thread_has_its_name() {
        let ((name, handle_works), _) = start("narad-test-ready", |ready| async move {
            let name = std::thread::current().name().map(str::to_string);
            // The runtime's timers work on the thread.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            ready.send((name, tokio::runtime::Handle::try_current().is_ok()));
        })
        .expect("started");
        assert_eq!(name.as_deref(), Some("narad-test-ready"));
        assert!(handle_works);
    }

    #[test]
    fn a_thread_that_ends_without_being_ready_is_an_error_not_a_hang() {
        let started = start("narad-test-ends", |ready: Ready<u32>| async move {
            drop(ready);
        });
        assert_eq!(started.err(), Some(StartError::Ended));
    }

    #[test]
    fn the_thread_runs_on_after_it_said_it_is_ready() {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (done_sender, done) = mpsc::channel();
        start("narad-test-runs", move |ready| async move {
            ready.send(());
            let _ = stopped.await;
            let _ = done_sender.send(());
        })
        .expect("started");
        assert!(done.try_recv().is_err(), "still running");
        let _ = stop.send(());
        done.recv_timeout(std::time::Duration::from_secs(10))
            .expect("it ended once told to");
    }
}

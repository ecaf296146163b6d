//! A consumer loop: consume, run the handler on each message while its
//! lease is extended, then ack or nack by what the handler says.

use std::future::Future;
use std::time::Duration;

use crate::{within, Client, ConsumeRequest, Delivery, Error};

/// What a handler decides about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done: ack it.
    Done,
    /// Not now: nack it, to be delivered again after the delay (or
    /// dead-lettered on its topic's last allowed delivery).
    Retry {
        /// How long until it is delivered again.
        delay: Duration,
    },
}

/// How a [`Consumer`] consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerOptions {
    /// Messages per consume (1-1,000).
    pub max_messages: u32,
    /// How long each consume waits for a first message (0-20,000 ms).
    pub wait: Duration,
    /// The lease each message gets, and gets again while its handler runs.
    pub visibility: Duration,
    /// Only this partition, if set.
    pub partition: Option<u32>,
}

/// The long poll a consumer waits by default (the API's longest).
pub const CONSUMER_WAIT_DEFAULT: Duration = Duration::from_secs(20);
/// The lease a consumer takes by default.
pub const CONSUMER_VISIBILITY_DEFAULT: Duration = Duration::from_secs(30);
/// A lease is extended once this share of it has passed (1 in 2).
const EXTEND_AT_FRACTION: u32 = 2;

impl Default for ConsumerOptions {
    fn default() -> Self {
        Self {
            max_messages: 10,
            wait: CONSUMER_WAIT_DEFAULT,
            visibility: CONSUMER_VISIBILITY_DEFAULT,
            partition: None,
        }
    }
}

/// Consumes a topic and hands each message to a handler.
///
/// While the handler runs, the message's lease is extended every half
/// lease, so a slow handler keeps its message; when it returns,
/// [`Outcome::Done`] acks the message and [`Outcome::Retry`] nacks it.
/// Messages are handled one at a time, in the order the node delivered
/// them. A handler that panics or is dropped (its task cancelled) settles
/// nothing: the lease runs out and the message is delivered again, as the
/// delivery contract says.
#[derive(Debug, Clone)]
pub struct Consumer {
    client: Client,
    topic: String,
    options: ConsumerOptions,
}

impl Consumer {
    /// A consumer of `topic` through `client`.
    pub fn new(client: Client, topic: &str, options: ConsumerOptions) -> Self {
        Self {
            client,
            topic: topic.to_string(),
            options,
        }
    }

    /// Consumes once and handles what came; how many messages were handled.
    /// An error of the consume is returned; an error settling one message
    /// (its lease already gone, say) is not: that message is delivered
    /// again anyway.
    pub async fn poll_once<H, F>(&self, handler: &mut H) -> Result<usize, Error>
    where
        H: FnMut(Delivery) -> F,
        F: Future<Output = Outcome>,
    {
        let request = ConsumeRequest {
            max_messages: Some(self.options.max_messages),
            wait_ms: Some(u64::try_from(self.options.wait.as_millis()).unwrap_or(u64::MAX)),
            visibility_timeout_ms: Some(
                u64::try_from(self.options.visibility.as_millis()).unwrap_or(u64::MAX),
            ),
            partition: self.options.partition,
        };
        let deliveries = self.client.consume(&self.topic, &request).await?;
        let count = deliveries.len();
        for delivery in deliveries {
            let receipt = delivery.receipt.clone();
            let outcome = self.handle_extending(&receipt, handler(delivery)).await;
            let _settled = match outcome {
                Outcome::Done => self.client.ack(&self.topic, &receipt).await,
                Outcome::Retry { delay } => self.client.nack(&self.topic, &receipt, delay).await,
            };
        }
        Ok(count)
    }

    /// Runs until `stop` resolves (checked between polls), or a consume
    /// fails with an error that retrying does not mend.
    pub async fn run<H, F>(
        &self,
        mut handler: H,
        stop: impl Future<Output = ()>,
    ) -> Result<(), Error>
    where
        H: FnMut(Delivery) -> F,
        F: Future<Output = Outcome>,
    {
        let mut stop = std::pin::pin!(stop);
        loop {
            let polled = tokio::select! {
                () = &mut stop => return Ok(()),
                polled = self.poll_once(&mut handler) => polled,
            };
            match polled {
                Ok(_) => {}
                Err(error) if error.is_retryable() => {
                    // The client already retried with backoff: wait a lease's
                    // share before the next round rather than spin.
                    let pause = self.options.visibility / EXTEND_AT_FRACTION;
                    if within(pause, &mut stop).await.is_some() {
                        return Ok(());
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Runs `handling` while extending `receipt`'s lease every half lease.
    async fn handle_extending(
        &self,
        receipt: &str,
        handling: impl Future<Output = Outcome>,
    ) -> Outcome {
        let mut handling = std::pin::pin!(handling);
        let every = (self.options.visibility / EXTEND_AT_FRACTION).max(Duration::from_millis(1));
        loop {
            if let Some(outcome) = within(every, &mut handling).await {
                return outcome;
            }
            // A failed extend leaves the lease to run out: the message is
            // then delivered again, and the handler's settle gets `410`.
            let _ = self
                .client
                .extend(&self.topic, receipt, self.options.visibility)
                .await;
        }
    }
}

//! A worker: produces a few jobs, then handles them with a [`Consumer`],
//! which extends each lease while the handler runs and acks or nacks by
//! what it returns.
//!
//! ```sh
//! narad serve &                       # a node on 127.0.0.1:8080
//! cargo run -p narad-client --example worker -- http://127.0.0.1:8080
//! ```

use std::time::Duration;

use narad_client::{Client, Consumer, ConsumerOptions, Outcome, Outgoing};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), narad_client::Error> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let client = Client::builder(&url).build()?;
    client
        .put_topic("jobs", &serde_json::json!({"partitions": 4}))
        .await?;
    let jobs: Vec<Outgoing> = (1..=5).map(|n| Outgoing::new(format!("job {n}"))).collect();
    let ids = client.produce_batch("jobs", &jobs).await?;
    println!("produced {} jobs", ids.len());

    let consumer = Consumer::new(client, "jobs", ConsumerOptions::default());
    let done = std::cell::Cell::new(0);
    while done.get() < jobs.len() {
        consumer
            .poll_once(&mut |delivery| {
                let done = &done;
                async move {
                    let text = String::from_utf8_lossy(&delivery.value).to_string();
                    if delivery.delivery_count == 1 && text.ends_with('3') {
                        // A transient failure: try again in a second.
                        println!("{text}: failed once, again in 1 s");
                        return Outcome::Retry {
                            delay: Duration::from_secs(1),
                        };
                    }
                    println!("{text}: done (delivery {})", delivery.delivery_count);
                    done.set(done.get() + 1);
                    Outcome::Done
                }
            })
            .await?;
    }
    Ok(())
}

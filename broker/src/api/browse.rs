//! Looking at a topic without changing it: a page of one partition.

use narad_net::query::Query;
use narad_net::types::browse_response_json;

use super::*;
use crate::limits::{BROWSE_LIMIT_DEFAULT, BROWSE_LIMIT_MAX};

/// `GET /v1/topics/{topic}/partitions/{partition}/messages?offset=&limit=`:
/// a page of the partition, read at its owner, each message with its state
/// and delivery count; nothing is leased, acked or counted.
pub(super) async fn browse(
    shard: &Rc<Shard>,
    route: Route<'_>,
    query: Option<&str>,
) -> Result<HttpResponse, ApiError> {
    let topic = shard.topic(route.topic()?)?;
    let partition = route.partition()?;
    let mut query = Query::parse(query)?;
    let offset = query.number("offset", 0..=u64::MAX)?;
    let limit = query
        .number("limit", 1..=u64::from(BROWSE_LIMIT_MAX))?
        .map_or(BROWSE_LIMIT_DEFAULT, |l| {
            u32::try_from(l).unwrap_or(BROWSE_LIMIT_MAX)
        });
    query.finish()?;
    let page = shard.browse(&topic, partition, offset, limit).await?;
    Ok(bytes_response(
        StatusCode::OK,
        "application/json",
        browse_response_json(&page),
    ))
}

//! Looking at a topic without changing it: a page of one partition, and a
//! search of every partition by key or text, resumable with a cursor.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use narad_net::query::Query;
use narad_net::types::{browse_response_json, search_response_json};

use super::*;
use crate::limits::{BROWSE_LIMIT_DEFAULT, BROWSE_LIMIT_MAX};
use crate::rates::RATE_INTERVAL_MS;

/// The `limit` parameter of a browse or a search: 1 to
/// `BROWSE_LIMIT_MAX`, `BROWSE_LIMIT_DEFAULT` when absent.
fn limit(query: &mut Query) -> Result<u32, ApiError> {
    Ok(query
        .number("limit", 1..=u64::from(BROWSE_LIMIT_MAX))?
        .map_or(BROWSE_LIMIT_DEFAULT, |l| {
            u32::try_from(l).unwrap_or(BROWSE_LIMIT_MAX)
        }))
}

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
    let limit = limit(&mut query)?;
    query.finish()?;
    let page = shard.browse(&topic, partition, offset, limit).await?;
    Ok(bytes_response(
        StatusCode::OK,
        "application/json",
        browse_response_json(&page),
    ))
}

/// `GET /v1/topics/{topic}/messages?key=&contains=&limit=&cursor=`: the
/// messages of every partition with that key and/or containing that text,
/// searched at their owners, at most `SEARCH_SCAN_MAX` messages of each
/// partition per call; the answer's `cursor` goes on from there (`null`:
/// every retained message was searched).
pub(super) async fn search(
    shard: &Rc<Shard>,
    route: Route<'_>,
    query: Option<&str>,
) -> Result<HttpResponse, ApiError> {
    let topic = shard.topic(route.topic()?)?;
    let mut query = Query::parse(query)?;
    let key = query.text("key").map(String::into_bytes);
    let contains = query.text("contains").map(String::into_bytes);
    let limit = limit(&mut query)?;
    let cursor = query.text("cursor");
    query.finish()?;
    if key.is_none() && contains.as_ref().is_none_or(Vec::is_empty) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "give key, or a non-empty contains, or both",
        ));
    }
    let at = match cursor {
        Some(cursor) => SearchCursor::decode(&cursor, topic.incarnation, topic.config.partitions)?,
        None => SearchCursor::start(topic.config.partitions),
    };
    let (messages, after) = shard.search(&topic, key, contains, &at.0, limit).await?;
    let after = SearchCursor(after);
    let cursor = (!after.is_done()).then(|| after.encode(topic.incarnation));
    Ok(bytes_response(
        StatusCode::OK,
        "application/json",
        search_response_json(&messages, cursor.as_deref()),
    ))
}

/// `GET /v1/topics/{topic}/rates`: the last 15 minutes of the topic, one
/// point per interval, from every partition's owner.
pub(super) async fn rates(
    shard: &Rc<Shard>,
    route: Route<'_>,
    query: Option<&str>,
) -> Result<HttpResponse, ApiError> {
    let topic = shard.topic(route.topic()?)?;
    Query::parse(query)?.finish()?;
    let points = shard.rates(&topic).await?;
    let points: Vec<Value> = points
        .iter()
        .map(|p| {
            json!({"at_ms": p.at_ms, "produced": p.produced, "acked": p.acked,
                "dead_lettered": p.dead_lettered, "available": p.available,
                "in_flight": p.in_flight})
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({"interval_ms": RATE_INTERVAL_MS, "points": points}),
    ))
}

/// Where a search stands: each partition's next offset to look at, `None`
/// once searched to its end. Clients hold it as an opaque string naming the
/// topic's incarnation, so a cursor of a deleted topic's namesake or of a
/// topic whose partitions changed is refused rather than misread.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SearchCursor(Vec<Option<u64>>);

impl SearchCursor {
    /// A new search: every partition from its oldest retained message.
    fn start(partitions: u32) -> Self {
        Self(vec![Some(0); partitions as usize])
    }

    fn is_done(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// The cursor of a search of the topic's `incarnation`.
    fn encode(&self, incarnation: u64) -> String {
        let at: Vec<String> = self
            .0
            .iter()
            .map(|o| o.map_or_else(|| "-".to_string(), |o| o.to_string()))
            .collect();
        URL_SAFE_NO_PAD.encode(format!("{incarnation}:{}", at.join(".")))
    }

    /// A cursor, if it is one of a search of this incarnation of a topic
    /// of `partitions` partitions.
    fn decode(text: &str, incarnation: u64, partitions: u32) -> Result<Self, ApiError> {
        let refused = || {
            ApiError::new(
                ErrorCode::InvalidRequest,
                "cursor is not one a search of this topic answered (was the topic recreated, or its partitions changed?)",
            )
        };
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| refused())?;
        let text = String::from_utf8(bytes).map_err(|_| refused())?;
        let (text_incarnation, at) = text.split_once(':').ok_or_else(refused)?;
        if text_incarnation.parse::<u64>().ok() != Some(incarnation) {
            return Err(refused());
        }
        let at = at
            .split('.')
            .map(|o| match o {
                "-" => Ok(None),
                o => o.parse::<u64>().map(Some).map_err(|_| refused()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if at.len() != partitions as usize {
            return Err(refused());
        }
        Ok(Self(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_written_and_another_topics_is_refused() {
        let cursor = SearchCursor(vec![Some(10_000), None, Some(0)]);
        let text = cursor.encode(7);
        assert!(text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        assert_eq!(SearchCursor::decode(&text, 7, 3).ok(), Some(cursor));
        assert!(SearchCursor::start(3).0.iter().all(|o| *o == Some(0)));
        assert!(SearchCursor(vec![None, None, None]).is_done());
        // Another incarnation of the topic, or other partitions.
        for (incarnation, partitions) in [(8, 3), (7, 4)] {
            let error = SearchCursor::decode(&text, incarnation, partitions).expect_err("refused");
            assert_eq!(error.code, ErrorCode::InvalidRequest);
        }
        for bad in ["", "!!", "Nzox", &URL_SAFE_NO_PAD.encode("7:1.x.2")] {
            assert!(SearchCursor::decode(bad, 7, 3).is_err(), "{bad}");
        }
    }
}

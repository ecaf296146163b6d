//! Kafka's framing, without I/O: a request is a 4-byte big-endian length
//! and that many bytes, a request header (API key, API version,
//! correlation id, client id, and tagged fields from header version 2)
//! then the request's body in that API version. An answer is a length, a
//! response header (the correlation id, tagged fields from version 1) and
//! the body.
//!
//! Nothing here panics on what a client sends: a length over the limit or
//! below the smallest header, or a header that does not decode, is a
//! [`FrameError`] after which the connection closes (the protocol has no
//! way to answer a frame whose correlation id it cannot read); an API or a
//! version the listener does not serve is [`FrameError::Unsupported`], with
//! the correlation id, so that ApiVersions can answer it (KIP-511) and any
//! other API closes the connection, as Kafka's brokers do.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};

/// Bytes of the length prefix of every frame.
pub const LENGTH_BYTES: usize = 4;
/// The smallest request header: API key, API version, correlation id.
const HEADER_FIXED_BYTES: usize = 2 + 2 + 4;

/// The APIs the listener serves, with the versions of each it takes.
/// Fetch is listed and answered `UNSUPPORTED_VERSION` (see `serve.rs`).
pub const SERVED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 12),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::ShareGroupHeartbeat, 1, 1),
    (ApiKey::ShareFetch, 1, 1),
    (ApiKey::ShareAcknowledge, 1, 1),
    // Version 0 of SaslHandshake would be followed by SASL bytes outside
    // Kafka's framing; every client tried sends version 1.
    (ApiKey::SaslHandshake, 1, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// The versions of `key` the listener serves.
pub fn served_versions(key: ApiKey) -> Option<(i16, i16)> {
    SERVED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|&(_, min, max)| (min, max))
}

/// Why a frame could not be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is negative, or over the listener's limit: the
    /// connection closes before the body is read.
    #[error("a request of {len} bytes is over the limit of {max} bytes")]
    TooLarge { len: i64, max: usize },
    /// Too short for a request header, or a header that does not decode.
    #[error("a malformed request: {0}")]
    Malformed(String),
    /// An API key or a version the listener does not serve.
    #[error("API key {api_key} version {api_version} is not served")]
    Unsupported {
        api_key: i16,
        api_version: i16,
        correlation_id: i32,
    },
}

/// A request whose header was read; its body still in the API's encoding.
#[derive(Debug, Clone)]
pub struct Request {
    pub api_key: ApiKey,
    pub api_version: i16,
    pub header: RequestHeader,
    pub body: Bytes,
}

/// Takes one whole frame (without its length) off the front of `buf`, if
/// `buf` holds one; `Ok(None)`: more bytes are needed. A length over
/// `max` is refused as soon as the prefix is in, before its body arrives.
pub fn split_frame(buf: &mut BytesMut, max: usize) -> Result<Option<Bytes>, FrameError> {
    let Some(prefix) = buf.get(..LENGTH_BYTES) else {
        return Ok(None);
    };
    let len = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    let size = usize::try_from(len)
        .ok()
        .filter(|size| *size <= max)
        .ok_or(FrameError::TooLarge {
            len: i64::from(len),
            max,
        })?;
    if buf.len() < LENGTH_BYTES + size {
        return Ok(None);
    }
    buf.advance(LENGTH_BYTES);
    Ok(Some(buf.split_to(size).freeze()))
}

/// Reads a frame's request header.
pub fn decode_request(mut frame: Bytes) -> Result<Request, FrameError> {
    let Some(fixed) = frame.get(..HEADER_FIXED_BYTES) else {
        return Err(FrameError::Malformed(format!(
            "{} bytes, fewer than a request header's {HEADER_FIXED_BYTES}",
            frame.len()
        )));
    };
    let raw_key = i16::from_be_bytes([fixed[0], fixed[1]]);
    let api_version = i16::from_be_bytes([fixed[2], fixed[3]]);
    let correlation_id = i32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
    let unsupported = FrameError::Unsupported {
        api_key: raw_key,
        api_version,
        correlation_id,
    };
    let Ok(api_key) = ApiKey::try_from(raw_key) else {
        return Err(unsupported);
    };
    match served_versions(api_key) {
        Some((min, max)) if (min..=max).contains(&api_version) => {}
        _ => return Err(unsupported),
    }
    let header_version = api_key.request_header_version(api_version);
    let header = RequestHeader::decode(&mut frame, header_version)
        .map_err(|e| FrameError::Malformed(format!("its header: {e}")))?;
    Ok(Request {
        api_key,
        api_version,
        header,
        body: frame,
    })
}

/// Encodes an answer to a request of `api_key` at `api_version`: length,
/// response header, body.
pub fn encode_response<M: Encodable>(
    api_key: ApiKey,
    api_version: i16,
    correlation_id: i32,
    body: &M,
) -> Result<Bytes, FrameError> {
    let header_version = api_key.response_header_version(api_version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let mut out = BytesMut::new();
    out.put_i32(0);
    header
        .encode(&mut out, header_version)
        .and_then(|()| body.encode(&mut out, api_version))
        .map_err(|e| FrameError::Malformed(format!("an answer did not encode: {e}")))?;
    let len = i32::try_from(out.len() - LENGTH_BYTES).map_err(|_| FrameError::TooLarge {
        len: out.len() as i64,
        max: i32::MAX as usize,
    })?;
    out[..LENGTH_BYTES].copy_from_slice(&len.to_be_bytes());
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ApiVersionsRequest;
    use kafka_protocol::protocol::StrBytes;

    /// A request frame as a client sends it (with its length).
    fn request_frame(
        key: ApiKey,
        version: i16,
        correlation_id: i32,
        body: &impl Encodable,
    ) -> BytesMut {
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("test")));
        let mut out = BytesMut::new();
        out.put_i32(0);
        header
            .encode(&mut out, key.request_header_version(version))
            .expect("header");
        body.encode(&mut out, version).expect("body");
        let len = (out.len() - LENGTH_BYTES) as i32;
        out[..LENGTH_BYTES].copy_from_slice(&len.to_be_bytes());
        out
    }

    fn api_versions(version: i16) -> BytesMut {
        let body = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("test"))
            .with_client_software_version(StrBytes::from_static_str("1"));
        request_frame(ApiKey::ApiVersions, version, 7, &body)
    }

    #[test]
    fn a_frame_comes_out_whole_once_all_its_bytes_are_in() {
        let whole = api_versions(3);
        let mut buf = BytesMut::new();
        for (at, byte) in whole.iter().enumerate() {
            assert_eq!(split_frame(&mut buf, 1024), Ok(None), "after {at} bytes");
            buf.put_u8(*byte);
        }
        let frame = split_frame(&mut buf, 1024).expect("frame").expect("whole");
        assert!(buf.is_empty());
        let request = decode_request(frame).expect("request");
        assert_eq!(request.api_key, ApiKey::ApiVersions);
        assert_eq!(request.api_version, 3);
        assert_eq!(request.header.correlation_id, 7);
        let body = ApiVersionsRequest::decode(&mut request.body.clone(), 3).expect("body");
        assert_eq!(body.client_software_name.as_str(), "test");
    }

    #[test]
    fn a_length_over_the_limit_or_negative_is_refused_before_its_body() {
        let mut buf = BytesMut::from(&(2_000i32).to_be_bytes()[..]);
        assert_eq!(
            split_frame(&mut buf, 1024),
            Err(FrameError::TooLarge {
                len: 2_000,
                max: 1024
            })
        );
        let mut buf = BytesMut::from(&(-1i32).to_be_bytes()[..]);
        assert!(matches!(
            split_frame(&mut buf, 1024),
            Err(FrameError::TooLarge { len: -1, .. })
        ));
    }

    #[test]
    fn an_api_or_version_not_served_keeps_its_correlation_id() {
        let mut frame = api_versions(3).split_off(LENGTH_BYTES);
        frame[2..4].copy_from_slice(&9i16.to_be_bytes());
        let frame = frame.freeze();
        assert_eq!(
            decode_request(frame).map(|r| r.api_key),
            Err(FrameError::Unsupported {
                api_key: ApiKey::ApiVersions as i16,
                api_version: 9,
                correlation_id: 7
            })
        );
        let mut unknown = BytesMut::new();
        unknown.put_i16(999);
        unknown.put_i16(0);
        unknown.put_i32(42);
        assert!(matches!(
            decode_request(unknown.freeze()),
            Err(FrameError::Unsupported {
                api_key: 999,
                correlation_id: 42,
                ..
            })
        ));
        assert!(matches!(
            decode_request(Bytes::from_static(&[0, 18, 0])),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn an_answer_carries_its_length_and_correlation_id() {
        use kafka_protocol::messages::ApiVersionsResponse;
        let body = ApiVersionsResponse::default();
        let out = encode_response(ApiKey::ApiVersions, 3, 99, &body).expect("encode");
        let len = i32::from_be_bytes([out[0], out[1], out[2], out[3]]) as usize;
        assert_eq!(len, out.len() - LENGTH_BYTES);
        assert_eq!(&out[4..8], &99i32.to_be_bytes());
    }

    /// xorshift64*, for the fuzz loop below (seeded: a failure repeats).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// Random bytes, and valid requests with bytes changed, cut short or
    /// grown: the framing and the header never panic, and a frame they take
    /// has a served API and version.
    #[test]
    fn fuzzed_frames_never_panic() {
        let seed = std::env::var("NARAD_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x9e37_79b9_7f4a_7c15u64);
        let mut rng = Rng(seed);
        let valid: Vec<BytesMut> = (0..=4).map(api_versions).collect();
        for _ in 0..20_000 {
            let mut bytes = if rng.below(4) == 0 {
                let len = rng.below(64);
                (0..len).map(|_| rng.next() as u8).collect::<BytesMut>()
            } else {
                valid[rng.below(valid.len())].clone()
            };
            for _ in 0..rng.below(4) {
                match rng.below(3) {
                    0 if !bytes.is_empty() => {
                        let at = rng.below(bytes.len());
                        bytes[at] = rng.next() as u8;
                    }
                    1 => bytes.truncate(rng.below(bytes.len() + 1)),
                    _ => bytes.put_u8(rng.next() as u8),
                }
            }
            let mut buf = bytes;
            while let Ok(Some(frame)) = split_frame(&mut buf, 4096) {
                if let Ok(request) = decode_request(frame) {
                    let (min, max) = served_versions(request.api_key).expect("served");
                    assert!((min..=max).contains(&request.api_version));
                    let _ =
                        ApiVersionsRequest::decode(&mut request.body.clone(), request.api_version);
                }
            }
        }
    }
}

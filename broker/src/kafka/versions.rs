//! What the listener tells a client it serves (ApiVersions), and how it
//! answers a version it does not serve: in version 0, with
//! `UNSUPPORTED_VERSION` and the same list, so the client can pick a
//! version both sides speak (KIP-511).

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::ApiVersionsResponse;
use kafka_protocol::ResponseError;

use super::frame::SERVED;

/// The version of ApiVersions an answer to an unsupported version is in.
pub const FALLBACK_VERSION: i16 = 0;

/// The answer to ApiVersions; `unsupported`: the request's version is not
/// served.
pub fn api_versions(unsupported: bool) -> ApiVersionsResponse {
    let api_keys = SERVED
        .iter()
        .map(|&(key, min, max)| {
            ApiVersion::default()
                .with_api_key(key as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(if unsupported {
            ResponseError::UnsupportedVersion.code()
        } else {
            0
        })
        .with_api_keys(api_keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::frame::{decode_request, encode_response, FrameError, LENGTH_BYTES};
    use bytes::{BufMut, Bytes, BytesMut};
    use kafka_protocol::messages::ApiKey;
    use kafka_protocol::protocol::Decodable;

    #[test]
    fn every_served_api_is_listed_with_its_versions() {
        let answer = api_versions(false);
        assert_eq!(answer.error_code, 0);
        let listed: Vec<(i16, i16, i16)> = answer
            .api_keys
            .iter()
            .map(|k| (k.api_key, k.min_version, k.max_version))
            .collect();
        let served: Vec<(i16, i16, i16)> = SERVED
            .iter()
            .map(|&(k, min, max)| (k as i16, min, max))
            .collect();
        assert_eq!(listed, served);
    }

    /// A client that asks in a version too new is answered in version 0
    /// with UNSUPPORTED_VERSION and the list, which it can decode.
    #[test]
    fn a_version_too_new_is_answered_in_version_zero_with_the_list() {
        let mut frame = BytesMut::new();
        frame.put_i16(ApiKey::ApiVersions as i16);
        frame.put_i16(99);
        frame.put_i32(5);
        frame.put_i16(-1);
        let Err(FrameError::Unsupported { correlation_id, .. }) = decode_request(frame.freeze())
        else {
            panic!("version 99 is not served");
        };
        let out = encode_response(
            ApiKey::ApiVersions,
            FALLBACK_VERSION,
            correlation_id,
            &api_versions(true),
        )
        .expect("encode");
        let mut body = Bytes::copy_from_slice(&out[LENGTH_BYTES + 4..]);
        let decoded = ApiVersionsResponse::decode(&mut body, FALLBACK_VERSION).expect("decode");
        assert_eq!(decoded.error_code, ResponseError::UnsupportedVersion.code());
        assert!(decoded
            .api_keys
            .iter()
            .any(|k| k.api_key == ApiKey::ApiVersions as i16));
    }
}

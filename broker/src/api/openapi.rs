//! The API document: `docs/openapi.yaml`, built into the binary and served
//! as JSON at `GET /v1/openapi.json`, so that a node describes the API it
//! serves.

use std::sync::OnceLock;

use bytes::Bytes;
use narad_net::{ApiError, ErrorCode};

/// The document as written.
pub const DOCUMENT_YAML: &str = include_str!("../../../docs/openapi.yaml");

/// The document as JSON bytes, converted once.
pub fn document_json() -> Result<Bytes, ApiError> {
    static JSON: OnceLock<Result<Bytes, String>> = OnceLock::new();
    JSON.get_or_init(|| {
        let value: serde_json::Value = serde_yaml_ng::from_str(DOCUMENT_YAML)
            .map_err(|e| format!("the built-in API document does not parse: {e}"))?;
        serde_json::to_vec(&value)
            .map(Bytes::from)
            .map_err(|e| format!("the built-in API document: {e}"))
    })
    .clone()
    .map_err(|message| ApiError::new(ErrorCode::Internal, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_is_json_once_converted_and_names_every_route_and_no_other() {
        let json = document_json().expect("the document converts");
        let document: serde_json::Value = serde_json::from_slice(&json).expect("json");
        assert_eq!(document["openapi"], "3.1.0");
        let paths = document["paths"].as_object().expect("paths");
        let mut documented: Vec<(String, String)> = paths
            .iter()
            .flat_map(|(path, item)| {
                item.as_object()
                    .into_iter()
                    .flat_map(|ops| ops.keys())
                    .filter(|m| {
                        matches!(
                            m.as_str(),
                            "get" | "put" | "post" | "delete" | "patch" | "head" | "options"
                        )
                    })
                    .map(move |m| (path.clone(), m.to_uppercase()))
            })
            .collect();
        let mut served: Vec<(String, String)> = super::super::ROUTES
            .iter()
            .flat_map(|spec| {
                spec.methods
                    .iter()
                    .map(|(m, _)| (spec.path.to_string(), m.as_str().to_string()))
            })
            .collect();
        documented.sort();
        served.sort();
        let missing: Vec<_> = served.iter().filter(|r| !documented.contains(r)).collect();
        let extra: Vec<_> = documented.iter().filter(|r| !served.contains(r)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "routes the document lacks: {missing:?}; routes the router lacks: {extra:?}"
        );
        // Every operation has an id and says what it answers.
        for (path, method) in &documented {
            let operation = &paths[path][method.to_lowercase()];
            assert!(operation["operationId"].is_string(), "{method} {path}");
            assert!(operation["responses"].is_object(), "{method} {path}");
        }
    }
}

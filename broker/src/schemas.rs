//! JSON Schema (draft 2020-12) documents, and the check of a topic's
//! messages against its schema's latest version (docs/schemas.md).
//!
//! A document is checked when it is put, and compiled once per version per
//! shard; a produce to a topic with a schema checks every message before
//! anything is written, and refuses the whole request with 422
//! `schema_mismatch` at the first message that does not match.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use jsonschema::Validator;
use narad_net::{ApiError, ErrorCode};
use narad_raft::state::MetaState;
use serde_json::Value;

use crate::limits::SCHEMA_DOCUMENT_BYTES_MAX;

/// A document a client put, checked: valid JSON, at most
/// [`SCHEMA_DOCUMENT_BYTES_MAX`], and a valid draft 2020-12 schema whose
/// references all resolve within it. Returns its compact text.
pub fn check_document(body: &[u8]) -> Result<String, ApiError> {
    let invalid = |message: String| ApiError::new(ErrorCode::InvalidRequest, message);
    if body.len() > SCHEMA_DOCUMENT_BYTES_MAX {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("a schema document may hold at most {SCHEMA_DOCUMENT_BYTES_MAX} bytes"),
        ));
    }
    // An empty body counts as `{}`, as for every JSON body of the API.
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    let document: Value = serde_json::from_slice(body)
        .map_err(|e| invalid(format!("the schema is not valid JSON: {e}")))?;
    if !document.is_object() && !document.is_boolean() {
        return Err(invalid(
            "a JSON Schema document is an object (or true or false)".to_string(),
        ));
    }
    jsonschema::draft202012::new(&document)
        .map_err(|e| invalid(format!("not a valid JSON Schema (draft 2020-12): {e}")))?;
    Ok(document.to_string())
}

/// This shard's compiled schemas: each by name with its version.
#[derive(Default)]
pub struct CompiledSchemas {
    /// By name: the document compiled (a schema deleted and made again
    /// starts its versions at 1 again) and its validator.
    compiled: RefCell<HashMap<String, (String, Rc<Validator>)>>,
}

impl CompiledSchemas {
    /// The validator of the latest version of `name`, compiled on first use.
    fn validator(&self, state: &MetaState, name: &str) -> Result<Rc<Validator>, ApiError> {
        let Some(schema) = state.schemas.get(name) else {
            return Err(ApiError::new(
                ErrorCode::Internal,
                format!("the topic's schema {name:?} is missing from the metadata"),
            ));
        };
        let (version, document) = schema.latest();
        if let Some((held, validator)) = self.compiled.borrow().get(name) {
            if held == document {
                return Ok(validator.clone());
            }
        }
        let compiled = serde_json::from_str::<Value>(document)
            .map_err(|e| e.to_string())
            .and_then(|doc| jsonschema::draft202012::new(&doc).map_err(|e| e.to_string()))
            .map_err(|e| {
                ApiError::new(
                    ErrorCode::Internal,
                    format!("schema {name:?} version {version} does not compile: {e}"),
                )
            })?;
        let validator = Rc::new(compiled);
        self.compiled
            .borrow_mut()
            .insert(name.to_string(), (document.to_string(), validator.clone()));
        Ok(validator)
    }

    /// Checks every value against schema `name`; an error names the index
    /// of the first message that does not match, where it fails and why.
    pub fn check<'v>(
        &self,
        state: &MetaState,
        name: &str,
        values: impl Iterator<Item = &'v [u8]>,
    ) -> Result<(), ApiError> {
        let validator = self.validator(state, name)?;
        let version = state.schemas.get(name).map_or(0, |s| s.latest().0);
        for (index, value) in values.enumerate() {
            let mismatch = |why: String| {
                ApiError::new(
                    ErrorCode::SchemaMismatch,
                    format!(
                        "message {index} does not match schema {name:?} (version {version}): {why}"
                    ),
                )
            };
            let instance: Value = serde_json::from_slice(value)
                .map_err(|e| mismatch(format!("its value is not JSON ({e})")))?;
            // The yes-or-no check is the fast one; where and why only for a
            // message that fails it.
            if validator.is_valid(&instance) {
                continue;
            }
            if let Err(error) = validator.validate(&instance) {
                let pointer = error.instance_path().as_str().to_string();
                let at = if pointer.is_empty() {
                    "at the root".to_string()
                } else {
                    format!("at {pointer}")
                };
                return Err(mismatch(format!("{at}: {error}")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_raft::state::Schema;

    fn state(versions: &[&str]) -> MetaState {
        let mut state = MetaState::default();
        state.schemas.insert(
            "order".into(),
            Schema {
                versions: versions.iter().map(|v| v.to_string()).collect(),
            },
        );
        state
    }

    const ORDER: &str = r#"{"type":"object","required":["id"],"properties":{"id":{"type":"integer"},"items":{"type":"array","items":{"type":"string"}}}}"#;

    #[test]
    fn documents_are_checked_when_put() {
        assert!(check_document(ORDER.as_bytes()).is_ok());
        assert!(check_document(b"true").is_ok());
        for bad in [
            &b"{"[..],
            b"42",
            br#"{"type": 5}"#,
            br#"{"$ref": "https://example.com/x"}"#,
        ] {
            assert_eq!(
                check_document(bad).map_err(|e| e.code),
                Err(ErrorCode::InvalidRequest),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_mismatch_names_the_message_and_the_place() {
        let schemas = CompiledSchemas::default();
        let state = state(&[ORDER]);
        let good: &[u8] = br#"{"id": 1, "items": ["a"]}"#;
        assert!(schemas.check(&state, "order", [good].into_iter()).is_ok());
        let bad: &[u8] = br#"{"id": 1, "items": ["a", 7]}"#;
        let error = schemas
            .check(&state, "order", [good, good, bad].into_iter())
            .expect_err("mismatch");
        assert_eq!(error.code, ErrorCode::SchemaMismatch);
        assert!(error.message.contains("message 2"), "{}", error.message);
        assert!(error.message.contains("/items/1"), "{}", error.message);
        let not_json: &[u8] = b"plain text";
        let error = schemas
            .check(&state, "order", [not_json].into_iter())
            .expect_err("not json");
        assert!(error.message.contains("not JSON"), "{}", error.message);
        let missing: &[u8] = b"{}";
        let error = schemas
            .check(&state, "order", [missing].into_iter())
            .expect_err("required");
        assert!(error.message.contains("at the root"), "{}", error.message);
    }

    #[test]
    fn a_schema_made_again_is_compiled_again_though_its_version_is_1_again() {
        let schemas = CompiledSchemas::default();
        let value: &[u8] = br#"{"id": "x"}"#;
        assert!(schemas
            .check(&state(&["{}"]), "order", [value].into_iter())
            .is_ok());
        assert!(schemas
            .check(&state(&[ORDER]), "order", [value].into_iter())
            .is_err());
    }

    #[test]
    fn a_new_version_is_compiled_when_it_arrives() {
        let schemas = CompiledSchemas::default();
        let value: &[u8] = br#"{"id": "x"}"#;
        assert!(schemas
            .check(&state(&["{}"]), "order", [value].into_iter())
            .is_ok());
        assert!(schemas
            .check(&state(&["{}", ORDER]), "order", [value].into_iter())
            .is_err());
    }
}

//! The query string of a GET: `name=value` pairs, percent-decoded. Every
//! parameter a route reads is taken by name; one it does not know is
//! refused (400 `unknown_field` naming it), and so is a value out of its
//! range: never clamped, never ignored.

use std::ops::RangeInclusive;

use crate::error::{ApiError, ErrorCode};

/// The parameters of one request, taken one by one.
#[derive(Debug, Default)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// The parameters of `raw` (the part of the URI after `?`, if any). A
    /// parameter given twice is refused.
    pub fn parse(raw: Option<&str>) -> Result<Self, ApiError> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (name, value) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            if pairs.iter().any(|(n, _)| *n == name) {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("query parameter {name:?} is given twice"),
                ));
            }
            pairs.push((name.into_owned(), value.into_owned()));
        }
        Ok(Self { pairs })
    }

    /// The text of parameter `name`, if given (an empty value counts as
    /// given).
    pub fn text(&mut self, name: &str) -> Option<String> {
        let index = self.pairs.iter().position(|(n, _)| n == name)?;
        Some(self.pairs.remove(index).1)
    }

    /// Parameter `name` as a whole number within `range`, if given.
    pub fn number(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<Option<u64>, ApiError> {
        let Some(text) = self.text(name) else {
            return Ok(None);
        };
        let out_of_range = || {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "{name} must be a whole number from {} to {}, got {text:?}",
                    range.start(),
                    range.end()
                ),
            )
        };
        let value: u64 = text.parse().map_err(|_| out_of_range())?;
        if range.contains(&value) {
            Ok(Some(value))
        } else {
            Err(out_of_range())
        }
    }

    /// Parameter `name` as `true` or `false`, if given.
    pub fn flag(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.text(name).as_deref() {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(other) => Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("{name} must be true or false, got {other:?}"),
            )),
        }
    }

    /// Refuses whatever parameter was not taken.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.pairs.first() {
            None => Ok(()),
            Some((name, _)) => Err(ApiError::new(
                ErrorCode::UnknownField,
                format!("unknown query parameter {name:?}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_decoded_taken_by_name_and_the_rest_refused() {
        let mut query =
            Query::parse(Some("key=customer%2042&contains=a+b&limit=5")).expect("parsed");
        assert_eq!(query.text("key").as_deref(), Some("customer 42"));
        assert_eq!(query.text("contains").as_deref(), Some("a b"));
        assert_eq!(query.number("limit", 1..=1000).ok(), Some(Some(5)));
        assert_eq!(query.number("offset", 0..=u64::MAX).ok(), Some(None));
        assert!(query.finish().is_ok());

        let mut unknown = Query::parse(Some("limit=5&colour=red")).expect("parsed");
        assert!(unknown.number("limit", 1..=1000).is_ok());
        let error = unknown.finish().expect_err("refused");
        assert_eq!(error.code, ErrorCode::UnknownField);
        assert!(error.message.contains("colour"), "{}", error.message);
    }

    #[test]
    fn flags_are_true_or_false_and_nothing_else() {
        let mut query = Query::parse(Some("a=true&b=false&c=yes")).expect("parsed");
        assert_eq!(query.flag("a").ok(), Some(Some(true)));
        assert_eq!(query.flag("b").ok(), Some(Some(false)));
        assert_eq!(query.flag("d").ok(), Some(None));
        let error = query.flag("c").expect_err("refused");
        assert_eq!(error.code, ErrorCode::InvalidRequest);
        assert!(error.message.contains("true or false"), "{}", error.message);
    }

    #[test]
    fn numbers_out_of_range_or_malformed_and_repeated_parameters_are_refused() {
        for bad in [
            "limit=0",
            "limit=1001",
            "limit=-1",
            "limit=x",
            "limit=",
            "limit=1e3",
        ] {
            let mut query = Query::parse(Some(bad)).expect("parsed");
            let error = query.number("limit", 1..=1000).expect_err(bad);
            assert_eq!(error.code, ErrorCode::InvalidRequest, "{bad}");
            assert!(
                error.message.contains("from 1 to 1000"),
                "{}",
                error.message
            );
        }
        let twice = Query::parse(Some("limit=1&limit=2")).expect_err("twice");
        assert_eq!(twice.code, ErrorCode::InvalidRequest);
        assert!(Query::parse(None).expect("empty").finish().is_ok());
    }
}

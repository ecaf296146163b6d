//! The console: the page every node serves at `/ui/` over its client port
//! (`ui.enabled`), and `GET /` leading there. Its three files are part of
//! the binary; it loads nothing from any other origin, and its answers say
//! so to the browser (`Content-Security-Policy`). The page works through
//! the API with the user's own credentials, so the files themselves are
//! open: with `auth.enabled` the page asks the user to sign in.

use super::*;

/// What the browser may load and run: this origin only, never in a frame.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The console's files: path, media type, bytes.
const FILES: &[(&str, &str, &[u8])] = &[
    (
        "/ui/",
        "text/html; charset=utf-8",
        include_bytes!("../../console/index.html"),
    ),
    (
        "/ui/app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../console/app.js"),
    ),
    (
        "/ui/app.css",
        "text/css; charset=utf-8",
        include_bytes!("../../console/app.css"),
    ),
];

/// Whether `path` is the console's (`/`, `/ui` and what is under `/ui/`).
pub fn is_console_path(path: &str) -> bool {
    path == "/" || path == "/ui" || path.starts_with("/ui/")
}

/// The answer to a request for a console path: `None` for any other path.
/// With `ui.enabled = false` the console's paths are `404`.
pub(super) fn answer(enabled: bool, method: &Method, path: &str) -> Option<HttpResponse> {
    if !is_console_path(path) {
        return None;
    }
    if !enabled {
        return Some(error_response(&ApiError::new(
            ErrorCode::NotFound,
            "the console is turned off on this node (ui.enabled = false)",
        )));
    }
    if method != Method::GET && method != Method::HEAD {
        let mut response = error_response(&ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!("{method} is not allowed on {path}; use GET"),
        ));
        response.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return Some(response);
    }
    if path == "/" || path == "/ui" {
        let mut response = empty_response(StatusCode::PERMANENT_REDIRECT);
        response.headers_mut().insert(
            hyper::header::LOCATION,
            hyper::header::HeaderValue::from_static("/ui/"),
        );
        return Some(response);
    }
    let Some((_, media_type, bytes)) = FILES.iter().find(|(p, _, _)| *p == path) else {
        return Some(error_response(&ApiError::new(
            ErrorCode::NotFound,
            format!("the console has no file {path}"),
        )));
    };
    let mut response = hyper::Response::new(Full::new(Bytes::from_static(bytes)));
    let headers = response.headers_mut();
    for (name, value) in [
        (hyper::header::CONTENT_TYPE, *media_type),
        (
            hyper::header::CONTENT_SECURITY_POLICY,
            CONTENT_SECURITY_POLICY,
        ),
        (hyper::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (hyper::header::X_FRAME_OPTIONS, "DENY"),
        (hyper::header::REFERRER_POLICY, "no-referrer"),
        // A new build's files are fetched again, never a stale mix.
        (hyper::header::CACHE_CONTROL, "no-cache"),
    ] {
        headers.insert(name, hyper::header::HeaderValue::from_static(value));
    }
    Some(response)
}

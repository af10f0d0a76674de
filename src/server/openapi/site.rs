//! `GET /openapi.json` and the offline API docs at `GET /docs`: Redoc 2 (vendored in
//! `assets/redoc/`, compiled into the binary), rendering the document the service serves. No
//! request leaves the host: no CDN, no fonts, no download at build time, and every answer
//! carries a `Content-Security-Policy` that allows the service's own origin only.
//!
//! The bundle is served with two substitutions ([`PATCHES`]), checked by the unit tests
//! against the vendored file: its sidebar logo, which Redoc loads from its CDN, comes from the
//! service (`docs/redoc-logo.svg`); and an `application/x-ndjson` example is shown as text
//! lines, not as a JSON string with escaped quotes and `\n` (Redoc takes every media type whose
//! name contains `json` for JSON).

use std::sync::LazyLock;

use axum::body::Bytes;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

const REDOC: &str = include_str!("../../../assets/redoc/redoc.standalone.js");
const LOGO: &str = include_str!("../../../assets/redoc/logo-mini.svg");

/// What the served bundle changes in the vendored one: each `(from, to)`, where `from` occurs
/// exactly once in the vendored bundle.
const PATCHES: [(&str, &str); 2] = [
    (
        r#"src:"https://cdn.redoc.ly/redoc/logo-mini.svg""#,
        r#"src:"docs/redoc-logo.svg""#,
    ),
    (
        "function ea(e){return-1!==e.search(/json/i)}",
        "function ea(e){return-1!==e.search(/json/i)&&-1===e.search(/ndjson/i)}",
    ),
];

/// The page's, its script's and the document's policy: everything from the service itself.
/// Redoc sets its styles from its script (`'unsafe-inline'` styles), draws some icons as `data:`
/// images and runs its search in a worker made from a `blob:` URL; nothing comes from another
/// origin.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; connect-src 'self'; worker-src blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page of `/docs`. Its URLs are relative, so that it works behind a proxy that serves the
/// service under a path prefix.
const PAGE: &str = r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>zkguard API</title>
<style>body { margin: 0; }</style>
</head>
<body>
<redoc spec-url="openapi.json" hide-download-button="false"></redoc>
<script src="docs/redoc.standalone.js"></script>
</body>
</html>
"#;

/// The vendored bundle with [`PATCHES`] applied (a missing one is logged, and the bundle served
/// as it is).
fn patched(bundle: &str) -> String {
    let mut served = bundle.to_string();
    for (from, to) in PATCHES {
        if !served.contains(from) {
            tracing::error!(
                from,
                "the vendored Redoc bundle lacks a text the service replaces"
            );
        }
        served = served.replacen(from, to, 1);
    }
    served
}

static SERVED: LazyLock<Bytes> = LazyLock::new(|| Bytes::from(patched(REDOC)));

fn with_type(body: impl IntoResponse, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

fn cached(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=86400"),
    );
    response
}

/// `GET /openapi.json`: the document, as generated when the router was built.
pub fn openapi_json(document: Bytes) -> Response {
    with_type(document, "application/json")
}

/// `GET /docs`: the API docs page.
pub async fn docs_page() -> Response {
    with_type(PAGE, "text/html; charset=utf-8")
}

/// `GET /docs/redoc.standalone.js`: the page's script.
pub async fn docs_asset() -> Response {
    cached(with_type(SERVED.clone(), "text/javascript; charset=utf-8"))
}

/// `GET /docs/redoc-logo.svg`: the logo of Redoc's sidebar.
pub async fn docs_logo() -> Response {
    cached(with_type(LOGO, "image/svg+xml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each substitution applies to exactly one place of the vendored bundle (an updated bundle
    /// that moved them fails here), and the served bundle names no CDN.
    #[test]
    fn the_served_bundle_takes_nothing_from_a_cdn() {
        for (from, _) in PATCHES {
            assert_eq!(REDOC.matches(from).count(), 1, "{from}");
        }
        let served = patched(REDOC);
        assert!(!served.contains("cdn.redoc.ly"));
        assert!(served.contains(r#"src:"docs/redoc-logo.svg""#));
        let grown: isize = PATCHES
            .iter()
            .map(|(from, to)| to.len() as isize - from.len() as isize)
            .sum();
        assert_eq!(served.len() as isize, REDOC.len() as isize + grown);
    }
}

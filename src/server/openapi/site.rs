//! `GET /openapi.json` and the offline API docs at `GET /docs`: Redoc 2 (vendored in
//! `assets/redoc/`, compiled into the binary), rendering the document the service serves. No
//! request leaves the host: no CDN, no fonts, no download at build time.

use axum::body::Bytes;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

const REDOC: &[u8] = include_bytes!("../../../assets/redoc/redoc.standalone.js");

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

fn with_type(body: impl IntoResponse, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
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
    let mut response = with_type(REDOC, "text/javascript; charset=utf-8");
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=86400"),
    );
    response
}

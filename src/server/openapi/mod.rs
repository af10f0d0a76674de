//! The service's contract: the OpenAPI 3.1 document of its routes (generated from the handlers'
//! `#[utoipa::path]` annotations as the router is built), its schemas and parameters, and the
//! offline API docs served at `/docs`.

// Types that describe bodies and parameters for the document; nothing constructs them.
#[allow(dead_code)]
mod answers;
mod doc;
#[allow(dead_code)]
mod params;
#[allow(dead_code)]
mod schemas;
mod site;
#[allow(dead_code)]
mod txn_schemas;

pub use answers::WriteAnswers;
pub use doc::{base, finish};
pub use params::*;
pub use schemas::*;
pub use site::{docs_asset, docs_logo, docs_page, openapi_json};
pub use txn_schemas::*;

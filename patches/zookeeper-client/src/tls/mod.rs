mod client;
mod options;
mod verifier;

pub(crate) use self::client::*;
pub use self::options::*;
use self::verifier::*;

//! Properties-file configuration with environment overrides.
//!
//! zkguard reads Java `.properties` files (the format of the original design's
//! `elasticsearch-details.properties`): `key=value`, `key: value` or `key value`, `#`/`!` comments,
//! `\uXXXX` escapes and `\` line continuations. Keys are flat names (`server.lock.ttl` and
//! `server.lock.ttl.max` are two keys); a key given twice takes its last value. Every key has a
//! default (see [`KEYS`]); a file overrides the defaults and an environment variable overrides the
//! file.
//!
//! # Environment overrides
//! The variable for a key is `ZKGUARD_` followed by the key in upper case with every `.` replaced by
//! `_`: `zookeeper.session.timeout` is overridden by `ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT`.
//!
//! Any other variable starting with `ZKGUARD_` draws a warning (with a "did you mean" hint), except
//! zkguard's own variables: `ZKGUARD_CONFIG`, the variables `zkguard exec` sets for its command
//! (`ZKGUARD_FENCING_TOKEN`, `ZKGUARD_MONITOR`, `ZKGUARD_LOCK_TYPE`, `ZKGUARD_EXEC_LOCK_BACKEND`,
//! `ZKGUARD_EXEC_ELASTICSEARCH_URL` and the deprecated `ZKGUARD_LOCK_BACKEND`, which is also the override of `lock.backend`), the
//! test kit's (`ZKGUARD_OSMEM_BIN`, `ZKGUARD_TANSU_BIN`, `ZKGUARD_KEEP_SERVER_DIRS`) and any `ZKGUARD_TEST_*`. A
//! variable that names a key but whose value is not UTF-8 is an error.
//!
//! # Durations
//! Duration keys take milliseconds (`5000`), as in the design, or a unit (`5s`, `250ms`, `2m`), up
//! to [`MAX_DURATION`] (7 days).
//!
//! # Elasticsearch credentials
//! `elasticsearch.url` may carry them (`http://user:password@host:9200`): they are then used as
//! basic authentication, as if given by `elasticsearch.username` and `elasticsearch.password`
//! (setting both is refused). Messages, logs and `Debug` output show URLs without their
//! user-info and never show the password.

// The rooms of the configuration: `keys` (the key table and its defaults), `settings` (the typed
// settings of each area), `sources` (defaults, properties files, `ZKGUARD_` variables, effective
// values), `reader` and `units` (parsing one value: numbers, durations, names, connect strings),
// `secrets` (credentials in URLs, masked values), `validate` (the whole configuration, typed and
// checked across keys), and the areas of their own: `gateway`, `grace`, `security`, `stamp`,
// `state`.
mod gateway;
pub mod grace;
mod keys;
mod patterns;
mod reader;
mod secrets;
mod security;
mod settings;
mod sources;
mod stamp;
mod state;
mod units;
mod validate;

use std::path::PathBuf;

pub use gateway::GatewaySettings;
pub use keys::KEYS;
pub use patterns::IndexPatterns;
pub(crate) use secrets::split_url_credentials;
pub use secrets::{display_urls, is_secret_key, masked_value, redact_urls};
pub use security::{EsTls, ZkAcl, ZkAclEntry, ZkAuth, ZkTls};
pub use settings::{
    DeadLetterSinkKind, EsLockSettings, EsSettings, JournalBackendKind, JournalKafkaSettings,
    KafkaSettings, LockBackendKind, RetrySettings, ServerSettings, Settings, TxnSettings,
    ZkSettings,
};
pub use sources::{env_var_for, EffectiveValue, ValueSource};
pub use stamp::{StampSettings, MAX_STAMP_WINDOW};
pub(crate) use units::split_zk_chroot;
pub use units::{parse_bounded_duration, parse_duration, MAX_DURATION};

/// A configuration error: which key, which value, where it came from and what is expected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value could not be parsed or is out of range.
    #[error("invalid value `{value}` for `{key}` (from {origin}): {expected}")]
    InvalidValue {
        /// The property key.
        key: String,
        /// The offending value.
        value: String,
        /// The file or environment variable it came from.
        origin: String,
        /// What the key accepts.
        expected: String,
    },
    /// The configuration file could not be read or parsed.
    #[error("cannot read configuration file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why it failed.
        reason: String,
    },
    /// A key in a zkguard namespace that zkguard does not know (most likely a typo).
    #[error(
        "unknown key `{key}` in {origin}{hint}; see conf/zkguard.properties for the list of keys"
    )]
    UnknownKey {
        /// The unknown key.
        key: String,
        /// The file it came from.
        origin: String,
        /// A "did you mean" hint, possibly empty.
        hint: String,
    },
}

#[cfg(test)]
mod tests;

//! Properties-file configuration with environment overrides.
//!
//! zkguard reads Java `.properties` files (the format of the original design's
//! `elasticsearch-details.properties`): `key=value`, `key: value` or `key value`, `#`/`!` comments,
//! `\uXXXX` escapes and `\` line continuations. Every key has a default (see [`KEYS`]); a file
//! overrides the defaults and an environment variable overrides the file.
//!
//! # Environment overrides
//! The variable for a key is `ZKGUARD_` followed by the key in upper case with every `.` replaced by
//! `_`: `zookeeper.session.timeout` is overridden by `ZKGUARD_ZOOKEEPER_SESSION_TIMEOUT`.
//!
//! # Durations
//! Duration keys take milliseconds (`5000`), as in the design, or a unit (`5s`, `250ms`, `2m`).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, Format, Map, Value, ValueKind};

use crate::lock::LockType;

/// A configuration error: which key, which value, where it came from and what is expected.
#[derive(Debug, thiserror::Error)]
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

/// Namespaces whose keys zkguard owns: an unknown key in one of them is reported as an error.
const OWNED_NAMESPACES: &[&str] = &[
    "zookeeper.",
    "elasticsearch.",
    "elastic.",
    "deadletter.",
    "lock.",
    "txn.",
];

/// Every configuration key with its default value and a one-line description.
///
/// `conf/zkguard.properties` documents each of them; the test suite checks that file against this
/// table.
pub const KEYS: &[(&str, &str, &str)] = &[
    ("zookeeper.servers", "localhost:2181", "comma-separated host:port list, optionally followed by a /chroot"),
    ("zookeeper.session.timeout", "5000", "ZooKeeper session timeout (ms)"),
    ("zookeeper.connection.retry", "5", "connection attempts at start and after a session expiry"),
    ("zookeeper.connection.delay", "1000", "delay between connection attempts (ms)"),
    ("zookeeper.foreground.lock.prefix", "A", "queue-node prefix of foreground contenders (lower sorts first)"),
    ("zookeeper.background.lock.prefix", "B", "queue-node prefix of background contenders"),
    ("zookeeper.foreground.task.timeout", "2000", "how long a foreground contender waits for the lock (ms)"),
    ("zookeeper.background.task.timeout", "2000", "how long a background contender waits for the lock (ms)"),
    ("zookeeper.lock.root", "/zkguard/locks", "znode under which every monitor object gets its lock node"),
    ("zookeeper.background.max.wait", "0", "anti-starvation: a background waiter re-queues as foreground after this long (ms); 0 = off"),
    ("zookeeper.lock.loss.grace", "0", "a held lock counts as lost after the connection has been down this long (ms); 0 = a quarter of the session timeout"),
    ("elastic.request.retry.count", "3", "attempts of a background operation before it is parked as a dead letter"),
    ("elastic.retry.backoff.initial", "100", "first retry delay of a background operation (ms); doubles each attempt, with jitter"),
    ("elastic.retry.backoff.max", "5000", "largest retry delay (ms)"),
    ("elasticsearch.url", "http://localhost:9200", "comma-separated Elasticsearch URLs"),
    ("elasticsearch.username", "", "basic-auth user name (empty = no authentication)"),
    ("elasticsearch.password", "", "basic-auth password"),
    ("elasticsearch.request.timeout", "30000", "timeout of one Elasticsearch request (ms)"),
    ("deadletter.sink", "file", "where parked operations go: file or elasticsearch"),
    ("deadletter.file.path", "zkguard-deadletters.jsonl", "JSON-lines dead-letter file"),
    ("deadletter.index", "zkguard-deadletters", "dead-letter index when deadletter.sink=elasticsearch"),
    ("lock.backend", "zookeeper", "lock service: zookeeper or elasticsearch"),
    ("elasticsearch.lock.index", "zkguard-locks", "index of the Elasticsearch lease lock"),
    ("elasticsearch.lock.ttl", "10000", "lease of an Elasticsearch lock (ms); renewed by keep-alive"),
    ("elasticsearch.lock.clock.skew", "1000", "largest clock difference assumed between contenders (ms)"),
    ("txn.accounts.index", "zkguard-accounts", "accounts index of multi-document transactions"),
    ("txn.transactions.index", "zkguard-transactions", "transaction-log index"),
    ("txn.recovery.after", "30000", "a transaction untouched this long is resumed by recovery (ms)"),
    ("txn.allow.overdraft", "false", "whether a transfer may leave the source balance negative"),
];

/// The lock-service backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockBackendKind {
    /// ZooKeeper priority lock.
    ZooKeeper,
    /// Elasticsearch lease lock.
    Elasticsearch,
}

/// Where dead letters are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterSinkKind {
    /// A JSON-lines file.
    File,
    /// An Elasticsearch index.
    Elasticsearch,
}

/// ZooKeeper settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ZkSettings {
    /// Connect string (`host:port,...[/chroot]`).
    pub servers: String,
    /// Requested session timeout.
    pub session_timeout: Duration,
    /// Connection attempts.
    pub connection_retry: u32,
    /// Delay between attempts.
    pub connection_delay: Duration,
    /// Foreground prefix.
    pub foreground_prefix: String,
    /// Background prefix.
    pub background_prefix: String,
    /// Foreground wait timeout.
    pub foreground_timeout: Duration,
    /// Background wait timeout.
    pub background_timeout: Duration,
    /// Lock root.
    pub lock_root: String,
    /// Anti-starvation threshold (`None` = off).
    pub background_max_wait: Option<Duration>,
    /// Disconnection grace before a held lock counts as lost (`None` = a quarter of the session timeout).
    pub loss_grace: Option<Duration>,
}

impl ZkSettings {
    /// The queue-node prefix of a lock type.
    pub fn prefix(&self, lock_type: LockType) -> &str {
        match lock_type {
            LockType::Foreground => &self.foreground_prefix,
            LockType::Background => &self.background_prefix,
        }
    }

    /// The wait timeout of a lock type.
    pub fn timeout(&self, lock_type: LockType) -> Duration {
        match lock_type {
            LockType::Foreground => self.foreground_timeout,
            LockType::Background => self.background_timeout,
        }
    }
}

impl Default for ZkSettings {
    fn default() -> Self {
        Settings::default().zookeeper
    }
}

/// Elasticsearch client settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EsSettings {
    /// One or more base URLs.
    pub urls: Vec<url::Url>,
    /// Basic-auth user.
    pub username: Option<String>,
    /// Basic-auth password.
    pub password: Option<String>,
    /// Per-request timeout.
    pub request_timeout: Duration,
}

/// Background retry and dead-letter settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RetrySettings {
    /// Attempts before parking (`elastic.request.retry.count`).
    pub retry_count: u32,
    /// First backoff delay.
    pub backoff_initial: Duration,
    /// Backoff cap.
    pub backoff_max: Duration,
    /// Dead-letter sink kind.
    pub sink: DeadLetterSinkKind,
    /// Dead-letter file.
    pub file_path: PathBuf,
    /// Dead-letter index.
    pub index: String,
}

/// Elasticsearch lease-lock settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EsLockSettings {
    /// Lock index.
    pub index: String,
    /// Lease length.
    pub ttl: Duration,
    /// Assumed maximum clock skew between contenders.
    pub clock_skew: Duration,
}

/// Multi-document transaction settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TxnSettings {
    /// Accounts index.
    pub accounts_index: String,
    /// Transactions index.
    pub transactions_index: String,
    /// Age after which recovery resumes a transaction.
    pub recovery_after: Duration,
    /// Whether overdrafts are allowed.
    pub allow_overdraft: bool,
}

/// The whole configuration, typed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settings {
    /// ZooKeeper.
    pub zookeeper: ZkSettings,
    /// Elasticsearch client.
    pub elasticsearch: EsSettings,
    /// Background retries and dead letters.
    pub retry: RetrySettings,
    /// Which lock backend.
    pub backend: LockBackendKind,
    /// Elasticsearch lease lock.
    pub es_lock: EsLockSettings,
    /// Transactions.
    pub txn: TxnSettings,
    /// The file the settings were read from, if any.
    pub source: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        let raw: HashMap<String, (String, String)> = KEYS
            .iter()
            .map(|(k, v, _)| (k.to_string(), (v.to_string(), "defaults".to_string())))
            .collect();
        Self::from_raw(&raw, None).expect("built-in defaults are valid")
    }
}

/// The `config` format for Java properties files, backed by `java-properties`.
#[derive(Debug, Clone, Copy)]
pub struct PropertiesFormat;

impl Format for PropertiesFormat {
    fn parse(
        &self,
        uri: Option<&String>,
        text: &str,
    ) -> Result<Map<String, Value>, Box<dyn std::error::Error + Send + Sync>> {
        let mut map = Map::new();
        let mut iter =
            java_properties::PropertiesIter::new_with_encoding(text.as_bytes(), encoding_rs::UTF_8);
        iter.read_into(|k, v| {
            // Keys are stored flat: dotted property names are not nested tables.
            map.insert(k.trim().to_string(), Value::new(uri, ValueKind::String(v)));
        })?;
        Ok(map)
    }
}

impl config::FileStoredFormat for PropertiesFormat {
    fn file_extensions(&self) -> &'static [&'static str] {
        &["properties"]
    }
}

/// The environment variable that overrides `key`.
pub fn env_var_for(key: &str) -> String {
    format!(
        "ZKGUARD_{}",
        key.to_ascii_uppercase().replace(['.', '-'], "_")
    )
}

impl Settings {
    /// Loads the defaults, then `path` (if given), then the environment overrides.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key, the value and the file or variable it came from.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env(path, |name| std::env::var(name).ok())
    }

    /// Like [`Settings::load`], reading overrides through `env` (for tests and embedding).
    ///
    /// # Errors
    /// See [`Settings::load`].
    pub fn load_with_env(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut raw: HashMap<String, (String, String)> = KEYS
            .iter()
            .map(|(k, v, _)| (k.to_string(), (v.to_string(), "defaults".to_string())))
            .collect();
        if let Some(path) = path {
            if !path.is_file() {
                return Err(ConfigError::File {
                    path: path.to_path_buf(),
                    reason: "no such file (pass --config with an existing .properties file)".into(),
                });
            }
            let file = config::File::new(&path.to_string_lossy(), PropertiesFormat).required(true);
            let cfg =
                Config::builder()
                    .add_source(file)
                    .build()
                    .map_err(|e| ConfigError::File {
                        path: path.to_path_buf(),
                        reason: e.to_string(),
                    })?;
            let table: Map<String, Value> =
                cfg.try_deserialize().map_err(|e| ConfigError::File {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })?;
            let origin = path.display().to_string();
            let mut flat = Vec::new();
            flatten(String::new(), table, &mut flat);
            for (key, value) in flat {
                if !raw.contains_key(&key) {
                    if OWNED_NAMESPACES.iter().any(|ns| key.starts_with(ns)) {
                        return Err(ConfigError::UnknownKey {
                            hint: did_you_mean(&key),
                            key,
                            origin,
                        });
                    }
                    tracing::debug!(%key, "ignoring a key outside zkguard's namespaces");
                    continue;
                }
                let text = value.into_string().map_err(|e| ConfigError::File {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })?;
                raw.insert(key, (text.trim().to_string(), origin.clone()));
            }
        }
        for (key, _, _) in KEYS {
            let var = env_var_for(key);
            if let Some(v) = env(&var) {
                raw.insert(
                    key.to_string(),
                    (v.trim().to_string(), format!("environment variable {var}")),
                );
            }
        }
        let mut settings = Self::from_raw(&raw, path)?;
        settings.source = path.map(Path::to_path_buf);
        Ok(settings)
    }

    fn from_raw(
        raw: &HashMap<String, (String, String)>,
        _path: Option<&Path>,
    ) -> Result<Self, ConfigError> {
        let r = Reader { raw };
        let zookeeper = ZkSettings {
            servers: r.non_empty("zookeeper.servers")?,
            session_timeout: r
                .duration_min("zookeeper.session.timeout", Duration::from_millis(1))?,
            connection_retry: r.int::<u32>("zookeeper.connection.retry", 1)?,
            connection_delay: r.duration("zookeeper.connection.delay")?,
            foreground_prefix: r.prefix("zookeeper.foreground.lock.prefix")?,
            background_prefix: r.prefix("zookeeper.background.lock.prefix")?,
            foreground_timeout: r.duration("zookeeper.foreground.task.timeout")?,
            background_timeout: r.duration("zookeeper.background.task.timeout")?,
            lock_root: r.zk_root("zookeeper.lock.root")?,
            background_max_wait: r.optional_duration("zookeeper.background.max.wait")?,
            loss_grace: r.optional_duration("zookeeper.lock.loss.grace")?,
        };
        if zookeeper.foreground_prefix == zookeeper.background_prefix {
            let (v, origin) = &raw["zookeeper.background.lock.prefix"];
            return Err(ConfigError::InvalidValue {
                key: "zookeeper.background.lock.prefix".into(),
                value: v.clone(),
                origin: origin.clone(),
                expected: "a prefix different from zookeeper.foreground.lock.prefix".into(),
            });
        }
        let elasticsearch = EsSettings {
            urls: r.urls("elasticsearch.url")?,
            username: r.optional_string("elasticsearch.username"),
            password: r.optional_string("elasticsearch.password"),
            request_timeout: r
                .duration_min("elasticsearch.request.timeout", Duration::from_millis(1))?,
        };
        let retry = RetrySettings {
            retry_count: r.int::<u32>("elastic.request.retry.count", 1)?,
            backoff_initial: r.duration("elastic.retry.backoff.initial")?,
            backoff_max: r.duration("elastic.retry.backoff.max")?,
            sink: match r.choice("deadletter.sink", &["file", "elasticsearch"])? {
                "file" => DeadLetterSinkKind::File,
                _ => DeadLetterSinkKind::Elasticsearch,
            },
            file_path: PathBuf::from(r.non_empty("deadletter.file.path")?),
            index: r.index_name("deadletter.index")?,
        };
        let backend = match r.choice("lock.backend", &["zookeeper", "elasticsearch"])? {
            "zookeeper" => LockBackendKind::ZooKeeper,
            _ => LockBackendKind::Elasticsearch,
        };
        let es_lock = EsLockSettings {
            index: r.index_name("elasticsearch.lock.index")?,
            ttl: r.duration_min("elasticsearch.lock.ttl", Duration::from_millis(100))?,
            clock_skew: r.duration("elasticsearch.lock.clock.skew")?,
        };
        if es_lock.clock_skew * 2 >= es_lock.ttl {
            let (v, origin) = &raw["elasticsearch.lock.clock.skew"];
            return Err(ConfigError::InvalidValue {
                key: "elasticsearch.lock.clock.skew".into(),
                value: v.clone(),
                origin: origin.clone(),
                expected: "less than half of elasticsearch.lock.ttl".into(),
            });
        }
        let txn = TxnSettings {
            accounts_index: r.index_name("txn.accounts.index")?,
            transactions_index: r.index_name("txn.transactions.index")?,
            recovery_after: r.duration("txn.recovery.after")?,
            allow_overdraft: r.boolean("txn.allow.overdraft")?,
        };
        Ok(Self {
            zookeeper,
            elasticsearch,
            retry,
            backend,
            es_lock,
            txn,
            source: None,
        })
    }
}

struct Reader<'a> {
    raw: &'a HashMap<String, (String, String)>,
}

impl Reader<'_> {
    fn get(&self, key: &str) -> (&str, &str) {
        let (v, o) = self
            .raw
            .get(key)
            .unwrap_or_else(|| panic!("key {key} is missing from KEYS"));
        (v.as_str(), o.as_str())
    }

    fn err(&self, key: &str, expected: impl fmt::Display) -> ConfigError {
        let (value, origin) = self.get(key);
        ConfigError::InvalidValue {
            key: key.to_string(),
            value: value.to_string(),
            origin: origin.to_string(),
            expected: expected.to_string(),
        }
    }

    fn non_empty(&self, key: &str) -> Result<String, ConfigError> {
        let (v, _) = self.get(key);
        if v.is_empty() {
            return Err(self.err(key, "a non-empty value"));
        }
        Ok(v.to_string())
    }

    fn optional_string(&self, key: &str) -> Option<String> {
        let (v, _) = self.get(key);
        (!v.is_empty()).then(|| v.to_string())
    }

    fn int<T: std::str::FromStr + PartialOrd + From<u8> + fmt::Display>(
        &self,
        key: &str,
        min: u8,
    ) -> Result<T, ConfigError> {
        let (v, _) = self.get(key);
        match v.parse::<T>() {
            Ok(n) if n >= T::from(min) => Ok(n),
            _ => Err(self.err(key, format!("a whole number of at least {min}"))),
        }
    }

    fn duration(&self, key: &str) -> Result<Duration, ConfigError> {
        let (v, _) = self.get(key);
        parse_duration(v).ok_or_else(|| {
            self.err(
                key,
                "a duration in milliseconds (e.g. 2000) or with a unit (e.g. 2s)",
            )
        })
    }

    fn duration_min(&self, key: &str, min: Duration) -> Result<Duration, ConfigError> {
        let d = self.duration(key)?;
        if d < min {
            return Err(self.err(key, format!("a duration of at least {}ms", min.as_millis())));
        }
        Ok(d)
    }

    fn optional_duration(&self, key: &str) -> Result<Option<Duration>, ConfigError> {
        let d = self.duration(key)?;
        Ok((!d.is_zero()).then_some(d))
    }

    fn boolean(&self, key: &str) -> Result<bool, ConfigError> {
        match self.get(key).0.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => Ok(true),
            "false" | "no" | "off" | "0" => Ok(false),
            _ => Err(self.err(key, "true or false")),
        }
    }

    fn choice<'c>(&self, key: &str, choices: &[&'c str]) -> Result<&'c str, ConfigError> {
        let v = self.get(key).0.to_ascii_lowercase();
        choices
            .iter()
            .find(|c| **c == v)
            .copied()
            .ok_or_else(|| self.err(key, format!("one of: {}", choices.join(", "))))
    }

    fn prefix(&self, key: &str) -> Result<String, ConfigError> {
        let (v, _) = self.get(key);
        if v.is_empty() || v.len() > 32 || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(self.err(key, "1 to 32 ASCII letters, digits or underscores (e.g. A)"));
        }
        Ok(v.to_string())
    }

    fn zk_root(&self, key: &str) -> Result<String, ConfigError> {
        let (v, _) = self.get(key);
        let ok = v.starts_with('/')
            && v.len() > 1
            && !v.ends_with('/')
            && v[1..]
                .split('/')
                .all(|seg| !seg.is_empty() && seg != "." && seg != ".." && seg != "zookeeper");
        if !ok {
            return Err(self.err(
                key,
                "an absolute znode path without a trailing slash, e.g. /zkguard/locks",
            ));
        }
        Ok(v.to_string())
    }

    fn index_name(&self, key: &str) -> Result<String, ConfigError> {
        let (v, _) = self.get(key);
        let ok = !v.is_empty()
            && v.len() <= 255
            && !v.starts_with(['-', '_', '+'])
            && v != "."
            && v != ".."
            && v.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c));
        if !ok {
            return Err(self.err(
                key,
                "a lowercase Elasticsearch index name (letters, digits, - _ .)",
            ));
        }
        Ok(v.to_string())
    }

    fn urls(&self, key: &str) -> Result<Vec<url::Url>, ConfigError> {
        let (v, _) = self.get(key);
        let mut out = Vec::new();
        for part in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match url::Url::parse(part) {
                Ok(u) if u.scheme() == "http" || u.scheme() == "https" => out.push(u),
                _ => return Err(self.err(key, "comma-separated http:// or https:// URLs")),
            }
        }
        if out.is_empty() {
            return Err(self.err(key, "at least one http:// or https:// URL"));
        }
        Ok(out)
    }
}

/// `config` nests dotted keys into tables; zkguard's keys are flat property names again.
fn flatten(prefix: String, table: Map<String, Value>, out: &mut Vec<(String, Value)>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k
        } else {
            format!("{prefix}.{k}")
        };
        match v.kind {
            ValueKind::Table(t) => flatten(key, t, out),
            _ => out.push((key, v)),
        }
    }
}

/// Parses `2000` (milliseconds) or a humantime duration such as `2s`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    if let Ok(ms) = t.parse::<u64>() {
        return Some(Duration::from_millis(ms));
    }
    humantime::parse_duration(t).ok()
}

fn did_you_mean(key: &str) -> String {
    let best = KEYS
        .iter()
        .map(|(k, _, _)| (strsim(key, k), *k))
        .min_by_key(|(d, _)| *d)
        .filter(|(d, _)| *d <= 4);
    match best {
        Some((_, k)) => format!(" (did you mean `{k}`?)"),
        None => String::new(),
    }
}

/// Levenshtein distance, for "did you mean" hints.
fn strsim(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new()
            .suffix(".properties")
            .tempfile()
            .unwrap();
        std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn defaults_match_the_issue() {
        let s = Settings::default();
        assert_eq!(s.zookeeper.servers, "localhost:2181");
        assert_eq!(s.zookeeper.session_timeout, Duration::from_millis(5000));
        assert_eq!(s.zookeeper.connection_retry, 5);
        assert_eq!(s.zookeeper.connection_delay, Duration::from_millis(1000));
        assert_eq!(s.zookeeper.foreground_prefix, "A");
        assert_eq!(s.zookeeper.background_prefix, "B");
        assert_eq!(s.zookeeper.foreground_timeout, Duration::from_millis(2000));
        assert_eq!(s.zookeeper.background_timeout, Duration::from_millis(2000));
        assert_eq!(s.retry.retry_count, 3);
        assert_eq!(s.zookeeper.lock_root, "/zkguard/locks");
        assert_eq!(s.zookeeper.background_max_wait, None);
    }

    #[test]
    fn properties_syntax_and_env_override() {
        let f = write(
            "# comment\n! also a comment\nzookeeper.servers = h1:1,\\\n    h2:2\nzookeeper.session.timeout: 3000\nzookeeper.foreground.lock.prefix \\u0041\nunrelated.key=1\n",
        );
        let s = Settings::load_with_env(Some(f.path()), |v| {
            (v == "ZKGUARD_ZOOKEEPER_CONNECTION_RETRY").then(|| "7".to_string())
        })
        .unwrap();
        assert_eq!(s.zookeeper.servers, "h1:1,h2:2");
        assert_eq!(s.zookeeper.session_timeout, Duration::from_millis(3000));
        assert_eq!(s.zookeeper.foreground_prefix, "A");
        assert_eq!(s.zookeeper.connection_retry, 7);
    }

    #[test]
    fn bad_value_names_key_value_and_file() {
        let f = write("zookeeper.session.timeout=abc\n");
        let err = Settings::load_with_env(Some(f.path()), |_| None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("zookeeper.session.timeout"), "{err}");
        assert!(err.contains("abc"), "{err}");
        assert!(err.contains(&f.path().display().to_string()), "{err}");
    }

    #[test]
    fn env_error_names_variable() {
        let err = Settings::load_with_env(None, |v| {
            (v == "ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT").then(|| "-5".to_string())
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("ZKGUARD_ZOOKEEPER_BACKGROUND_TASK_TIMEOUT"),
            "{err}"
        );
    }

    #[test]
    fn typo_gets_a_hint() {
        let f = write("zookeeper.sesion.timeout=3000\n");
        let err = Settings::load_with_env(Some(f.path()), |_| None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("did you mean `zookeeper.session.timeout`"),
            "{err}"
        );
    }

    #[test]
    fn equal_prefixes_are_rejected() {
        let f = write("zookeeper.background.lock.prefix=A\n");
        let err = Settings::load_with_env(Some(f.path()), |_| None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("different from zookeeper.foreground.lock.prefix"),
            "{err}"
        );
    }

    #[test]
    fn shipped_properties_file_lists_every_key_with_its_default() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/zkguard.properties");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut found = HashMap::new();
        java_properties::PropertiesIter::new_with_encoding(text.as_bytes(), encoding_rs::UTF_8)
            .read_into(|k, v| {
                found.insert(k, v);
            })
            .unwrap();
        for (k, default, _) in KEYS {
            assert_eq!(
                found.get(*k).map(String::as_str),
                Some(*default),
                "conf/zkguard.properties: {k}"
            );
        }
        assert_eq!(
            found.len(),
            KEYS.len(),
            "conf/zkguard.properties has keys zkguard does not know"
        );
        Settings::load_with_env(Some(&path), |_| None).unwrap();
    }
}

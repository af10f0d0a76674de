//! Where values come from: the built-in defaults, a properties file, the `ZKGUARD_` environment
//! variables; loading [`Settings`] from them and showing each key's effective value.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use super::keys::{KEYS, OWNED_NAMESPACES};
use super::secrets::{masked_value, shown_value, world_readable_secrets};
use super::settings::Settings;
use super::ConfigError;

impl Default for Settings {
    fn default() -> Self {
        let raw: HashMap<String, (String, String)> = KEYS
            .iter()
            .map(|(k, v, _)| (k.to_string(), (v.to_string(), "defaults".to_string())))
            .collect();
        Self::from_raw(&raw, None).expect("built-in defaults are valid")
    }
}

/// The `key`/value pairs of a properties file in file order (a repeated key appears each time;
/// the last one wins, as in Java). Keys are flat names: `server.lock.ttl` and
/// `server.lock.ttl.max` are two keys, neither nested in the other.
fn read_properties(path: &Path) -> Result<Vec<(String, String)>, ConfigError> {
    let text = read_config_file(path)?;
    let mut pairs = Vec::new();
    java_properties::PropertiesIter::new_with_encoding(text.as_bytes(), encoding_rs::UTF_8)
        .read_into(|k, v| pairs.push((k.trim().to_string(), v)))
        .map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    Ok(pairs)
}

/// The prefix of zkguard's environment variables.
const ENV_PREFIX: &str = "ZKGUARD_";

/// What `zkguard exec` tells its command: the backend of the lock it holds for it (not an
/// override of `lock.backend`, unlike the deprecated `ZKGUARD_LOCK_BACKEND` it also sets).
pub(crate) const EXEC_BACKEND_VAR: &str = "ZKGUARD_EXEC_LOCK_BACKEND";

/// zkguard's own environment variables that are not configuration keys: the configuration file,
/// what `zkguard exec` sets for its command (so a zkguard run inside `exec` stays quiet) and the
/// test kit's. Any `ZKGUARD_TEST_*` variable is the test kit's too.
pub(crate) const OWN_VARIABLES: &[&str] = &[
    "ZKGUARD_CONFIG",
    "ZKGUARD_FENCING_TOKEN",
    "ZKGUARD_MONITOR",
    "ZKGUARD_LOCK_TYPE",
    EXEC_BACKEND_VAR,
    "ZKGUARD_EXEC_ELASTICSEARCH_URL",
    "ZKGUARD_LOCK_BACKEND",
    "ZKGUARD_OSMEM_BIN",
    "ZKGUARD_TANSU_BIN",
    "ZKGUARD_KEEP_SERVER_DIRS",
];

fn is_own_variable(name: &str) -> bool {
    OWN_VARIABLES.contains(&name) || name.starts_with("ZKGUARD_TEST_")
}

/// The environment variable that overrides `key` (`zookeeper.servers`: `ZKGUARD_ZOOKEEPER_SERVERS`).
pub fn env_var_for(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.to_ascii_uppercase().replace(['.', '-'], "_")
    )
}

/// Reads a configuration file, saying precisely why it cannot be read (missing, a directory,
/// not readable by this user, not UTF-8).
fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    use std::io::{ErrorKind, Read};
    let fail = |reason: String| ConfigError::File {
        path: path.to_path_buf(),
        reason,
    };
    let io_reason = |e: &std::io::Error| {
        match e.kind() {
        ErrorKind::NotFound => {
            "no such file; pass --config with an existing .properties file".to_string()
        }
        ErrorKind::PermissionDenied => {
            "permission denied: this user may not read it; fix its permissions or run as a user who can"
                .to_string()
        }
        ErrorKind::IsADirectory => {
            "it is a directory; pass --config the .properties file inside it".to_string()
        }
        ErrorKind::InvalidData => "it is not UTF-8 text; save it as UTF-8".to_string(),
        _ => e.to_string(),
    }
    };
    let mut file = std::fs::File::open(path).map_err(|e| fail(io_reason(&e)))?;
    // Opening a directory for reading succeeds on Unix; reading it fails with EISDIR, but ask
    // first so the message does not depend on the platform.
    if file.metadata().map(|m| m.is_dir()).unwrap_or(false) {
        return Err(fail(
            "it is a directory; pass --config the .properties file inside it".into(),
        ));
    }
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| fail(io_reason(&e)))?;
    Ok(text)
}

/// Where the effective value of a key came from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueSource {
    /// The built-in default (see [`KEYS`]).
    Default,
    /// The properties file given with `--config`.
    File(PathBuf),
    /// The environment variable named (`ZKGUARD_...`).
    Environment(String),
}

impl ValueSource {
    /// `default`, `file` or `env`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::File(_) => "file",
            Self::Environment(_) => "env",
        }
    }
}

impl fmt::Display for ValueSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Environment(var) => write!(f, "environment variable {var}"),
        }
    }
}

/// One key of the effective configuration, as `zkguard config show` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EffectiveValue {
    /// The key (`zookeeper.servers`, ...).
    pub key: String,
    /// The value as given (trimmed), with secrets masked as `***`: a non-empty value of a key
    /// whose name ends in `password`, `secret`, `token`, `key` or `credentials`, and the
    /// user-info of URLs (`http://***@host:9200`).
    pub value: String,
    /// Where the value came from.
    pub source: ValueSource,
}

impl Settings {
    /// Loads the defaults, then `path` (if given), then the environment overrides read from the
    /// process environment (see [`Settings::load_with_vars`]).
    ///
    /// # Errors
    /// [`ConfigError`] naming the key, the value and the file or variable it came from.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_vars(path, std::env::vars_os())
    }

    /// Like [`Settings::load`], reading overrides from `vars` (name and value pairs, as
    /// [`std::env::vars_os`] gives them).
    ///
    /// A `ZKGUARD_` variable that names no key and is not one of zkguard's own variables adds a
    /// warning with a "did you mean" hint to [`Settings::warnings`], for the caller to show (the
    /// `zkguard` command prints them on stderr).
    ///
    /// # Errors
    /// As [`Settings::load`]; also [`ConfigError::InvalidValue`] when the value of a variable that
    /// names a key is not UTF-8.
    pub fn load_with_vars(
        path: Option<&Path>,
        vars: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Self, ConfigError> {
        let key_vars: HashMap<String, &str> =
            KEYS.iter().map(|(k, _, _)| (env_var_for(k), *k)).collect();
        let mut values = HashMap::new();
        let mut warnings = Vec::new();
        for (name, value) in vars {
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with(ENV_PREFIX) {
                continue;
            }
            if let Some(key) = key_vars.get(name) {
                match value.into_string() {
                    Ok(v) => {
                        values.insert(name.to_string(), v);
                    }
                    Err(raw) => {
                        return Err(ConfigError::InvalidValue {
                            key: key.to_string(),
                            value: shown_value(key, &raw.to_string_lossy()),
                            origin: format!("environment variable {name}"),
                            expected: "UTF-8 text (the value has bytes that are not UTF-8)".into(),
                        });
                    }
                }
            } else if name == EXEC_BACKEND_VAR {
                // Read by `raw_values` to recognise the deprecated ZKGUARD_LOCK_BACKEND.
                if let Some(v) = value.to_str() {
                    values.insert(name.to_string(), v.to_string());
                }
            } else if !is_own_variable(name) {
                warnings.push(format!(
                    "environment variable {name} is not a zkguard setting and is ignored{}",
                    did_you_mean_var(name)
                ));
            }
        }
        let mut settings = Self::load_with_env(path, |name| values.get(name).cloned())?;
        warnings.append(&mut settings.warnings);
        settings.warnings = warnings;
        Ok(settings)
    }

    /// Like [`Settings::load`], reading overrides through `env` (for tests and embedding). It
    /// looks up the variable of each key only, so it cannot warn about unknown variables.
    ///
    /// # Errors
    /// See [`Settings::load`].
    pub fn load_with_env(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let raw = raw_values(path, env)?;
        let mut settings = Self::from_raw(&raw, path)?;
        settings.source = path.map(Path::to_path_buf);
        if let Some(path) = path {
            settings.warnings.extend(world_readable_secrets(path, &raw));
        }
        Ok(settings)
    }

    /// Every key's effective value and where it came from, after checking the whole
    /// configuration as [`Settings::load_with_env`] does (no server is contacted). Secrets are
    /// masked (see [`EffectiveValue::value`]).
    ///
    /// # Errors
    /// See [`Settings::load`].
    pub fn effective_values(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<EffectiveValue>, ConfigError> {
        let raw = raw_values(path, env)?;
        Self::from_raw(&raw, path)?;
        Ok(KEYS
            .iter()
            .map(|(key, _, _)| {
                let (value, origin) = &raw[*key];
                let source = if origin == "defaults" {
                    ValueSource::Default
                } else if let Some(var) = origin.strip_prefix("environment variable ") {
                    ValueSource::Environment(var.to_string())
                } else {
                    ValueSource::File(path.map(Path::to_path_buf).unwrap_or_default())
                };
                EffectiveValue {
                    key: key.to_string(),
                    value: masked_value(key, value),
                    source,
                }
            })
            .collect())
    }
}

/// Whether the `lock.backend` override `var`=`value` applies. `ZKGUARD_LOCK_BACKEND` is also
/// what `zkguard exec` sets for its command (deprecated, beside `ZKGUARD_EXEC_LOCK_BACKEND`):
/// when it equals that export (`held`) and a file names another backend, it is exec's
/// notice, not an override, and the file's backend stands (`Ok(false)`). Otherwise a variable
/// that disagrees with the file is refused rather than switching backends silently, since the
/// two backends do not exclude each other.
fn backend_override(
    raw: &HashMap<String, (String, String)>,
    var: &str,
    value: &str,
    held: Option<&str>,
) -> Result<bool, ConfigError> {
    let (file_value, origin) = &raw["lock.backend"];
    if origin == "defaults" || file_value == value {
        return Ok(true);
    }
    if held == Some(value) {
        tracing::debug!(%var, %value, %origin, "{var} is what `zkguard exec` exported, not an override; lock.backend={file_value} from {origin} stands");
        return Ok(false);
    }
    Err(ConfigError::InvalidValue {
        key: "lock.backend".into(),
        value: value.into(),
        origin: format!("environment variable {var}"),
        expected: format!(
            "the backend {origin} names: {var}={value} disagrees with lock.backend={file_value} there, and the two backends do not exclude each other; unset {var}, or change lock.backend in {origin}"
        ),
    })
}

/// The raw text of every key with its origin (`defaults`, the file's path, or `environment
/// variable NAME`): defaults, then the file, then the environment.
pub(super) fn raw_values(
    path: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<HashMap<String, (String, String)>, ConfigError> {
    let mut raw: HashMap<String, (String, String)> = KEYS
        .iter()
        .map(|(k, v, _)| (k.to_string(), (v.to_string(), "defaults".to_string())))
        .collect();
    if let Some(path) = path {
        let origin = path.display().to_string();
        for (key, value) in read_properties(path)? {
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
            raw.insert(key, (value.trim().to_string(), origin.clone()));
        }
    }
    let held = env(EXEC_BACKEND_VAR).map(|v| v.trim().to_string());
    for (key, _, _) in KEYS {
        let var = env_var_for(key);
        if let Some(v) = env(&var) {
            if *key == "lock.backend" && !backend_override(&raw, &var, v.trim(), held.as_deref())? {
                continue;
            }
            raw.insert(
                key.to_string(),
                (v.trim().to_string(), format!("environment variable {var}")),
            );
        }
    }
    Ok(raw)
}

/// The "did you mean" hint of an unknown `ZKGUARD_` variable: the closest key's variable.
fn did_you_mean_var(name: &str) -> String {
    let best = KEYS
        .iter()
        .map(|(k, _, _)| env_var_for(k))
        .chain(OWN_VARIABLES.iter().map(|v| v.to_string()))
        .map(|v| (strsim(name, &v), v))
        .min_by_key(|(d, _)| *d)
        .filter(|(d, _)| *d <= 4);
    match best {
        Some((_, v)) => format!(" (did you mean {v}?)"),
        None => String::new(),
    }
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

//! [`Reader`]: reads one key's raw text as the type it holds (numbers, durations, names, TLS
//! files, ZooKeeper authentication and ACLs), naming key, value and origin when it cannot.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::secrets::shown_value;
use super::security::{EsTls, ZkAcl, ZkAclEntry, ZkAuth, ZkTls};
use super::units::{check_zk_servers, parse_duration, MAX_DURATION};
use super::{security, ConfigError};

pub(super) struct Reader<'a> {
    pub(super) raw: &'a HashMap<String, (String, String)>,
}

impl Reader<'_> {
    pub(super) fn get(&self, key: &str) -> (&str, &str) {
        let (v, o) = self
            .raw
            .get(key)
            .unwrap_or_else(|| panic!("key {key} is missing from KEYS"));
        (v.as_str(), o.as_str())
    }

    pub(super) fn err(&self, key: &str, expected: impl fmt::Display) -> ConfigError {
        let (value, origin) = self.get(key);
        ConfigError::InvalidValue {
            key: key.to_string(),
            value: shown_value(key, value),
            origin: origin.to_string(),
            expected: expected.to_string(),
        }
    }

    pub(super) fn non_empty(&self, key: &str) -> Result<String, ConfigError> {
        let (v, _) = self.get(key);
        if v.is_empty() {
            return Err(self.err(key, "a non-empty value"));
        }
        Ok(v.to_string())
    }

    pub(super) fn optional_string(&self, key: &str) -> Option<String> {
        let (v, _) = self.get(key);
        (!v.is_empty()).then(|| v.to_string())
    }

    pub(super) fn int<T: std::str::FromStr + PartialOrd + From<u8> + fmt::Display>(
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

    /// A number of bytes, at least `min`.
    pub(super) fn bytes_min(&self, key: &str, min: usize) -> Result<usize, ConfigError> {
        let (v, _) = self.get(key);
        match v.trim().parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(self.err(key, format!("a number of bytes of at least {min}"))),
        }
    }

    pub(super) fn duration(&self, key: &str) -> Result<Duration, ConfigError> {
        let (v, _) = self.get(key);
        let d = parse_duration(v).ok_or_else(|| {
            self.err(
                key,
                "a duration in milliseconds (e.g. 2000) or with a unit (e.g. 2s)",
            )
        })?;
        if d > MAX_DURATION {
            return Err(self.err(
                key,
                format!("a duration of at most 7d ({} ms)", MAX_DURATION.as_millis()),
            ));
        }
        Ok(d)
    }

    pub(super) fn duration_min(&self, key: &str, min: Duration) -> Result<Duration, ConfigError> {
        let d = self.duration(key)?;
        if d < min {
            return Err(self.err(key, format!("a duration of at least {}ms", min.as_millis())));
        }
        Ok(d)
    }

    pub(super) fn optional_duration(&self, key: &str) -> Result<Option<Duration>, ConfigError> {
        let d = self.duration(key)?;
        Ok((!d.is_zero()).then_some(d))
    }

    pub(super) fn boolean(&self, key: &str) -> Result<bool, ConfigError> {
        match self.get(key).0.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => Ok(true),
            "false" | "no" | "off" | "0" => Ok(false),
            _ => Err(self.err(key, "true or false")),
        }
    }

    /// `zookeeper.auth.*`: the scheme, then the credentials, given inline or by a file (never
    /// both), `user:password` for `digest`. Messages never show the credentials.
    pub(super) fn zk_auth(&self) -> Result<Option<ZkAuth>, ConfigError> {
        const INLINE: &str = "zookeeper.auth.credentials";
        const FILE: &str = "zookeeper.auth.credentials.file";
        const SASL_KEYS: [&str; 3] = [
            "zookeeper.sasl.username",
            "zookeeper.sasl.password",
            "zookeeper.sasl.password.file",
        ];
        let scheme = self.choice("zookeeper.auth.scheme", &["none", "digest", "sasl"])?;
        let inline = self.optional_string(INLINE);
        let file = self.optional_string(FILE);
        let unused = match scheme {
            "none" => [INLINE, FILE]
                .iter()
                .chain(SASL_KEYS.iter())
                .find(|k| self.optional_string(k).is_some()),
            "digest" => SASL_KEYS.iter().find(|k| self.optional_string(k).is_some()),
            _ => [INLINE, FILE]
                .iter()
                .find(|k| self.optional_string(k).is_some()),
        };
        if let Some(key) = unused {
            let wanted = if key.starts_with("zookeeper.sasl.") {
                "sasl"
            } else {
                "digest"
            };
            return Err(self.err(
                key,
                format!("empty while zookeeper.auth.scheme is {scheme}; set zookeeper.auth.scheme={wanted} to use it"),
            ));
        }
        match scheme {
            "none" => return Ok(None),
            "sasl" => return self.zk_sasl().map(Some),
            _ => {}
        }
        let credentials = match (inline, file) {
            (Some(_), Some(_)) => {
                return Err(self.err(
                    INLINE,
                    "empty when zookeeper.auth.credentials.file is set; give the credentials once",
                ))
            }
            (None, None) => {
                return Err(self.err(
                    INLINE,
                    "user:password (or zookeeper.auth.credentials.file) when zookeeper.auth.scheme=digest",
                ))
            }
            (Some(inline), None) => (inline, INLINE),
            (None, Some(path)) => (self.secret_file(FILE, &path)?, FILE),
        };
        let (credentials, key) = credentials;
        match credentials.split_once(':') {
            Some((user, _)) if !user.is_empty() => Ok(Some(ZkAuth::digest(credentials))),
            _ => Err(self.err(
                key,
                "digest credentials of the form user:password (the value is not shown)",
            )),
        }
    }

    /// `zookeeper.sasl.*` when `zookeeper.auth.scheme=sasl`: DIGEST-MD5 with a user name and a
    /// password given inline or by a file. GSSAPI is refused: it is not built in.
    fn zk_sasl(&self) -> Result<ZkAuth, ConfigError> {
        const MECHANISM: &str = "zookeeper.sasl.mechanism";
        const USER: &str = "zookeeper.sasl.username";
        match self.get(MECHANISM).0.to_ascii_uppercase().as_str() {
            "DIGEST-MD5" => {}
            "GSSAPI" => {
                return Err(self.err(
                    MECHANISM,
                    "DIGEST-MD5: zkguard is built without GSSAPI (Kerberos) support; use DIGEST-MD5 (or zookeeper.auth.scheme=digest)",
                ))
            }
            _ => return Err(self.err(MECHANISM, "DIGEST-MD5")),
        }
        let user = self
            .optional_string(USER)
            .ok_or_else(|| self.err(USER, "the SASL user name when zookeeper.auth.scheme=sasl"))?;
        if user.contains(':') {
            return Err(self.err(USER, "a user name without `:`"));
        }
        let password = self
            .secret("zookeeper.sasl.password", "zookeeper.sasl.password.file")?
            .ok_or_else(|| {
                self.err(
                    "zookeeper.sasl.password",
                    "the SASL password (or zookeeper.sasl.password.file) when zookeeper.auth.scheme=sasl",
                )
            })?;
        Ok(ZkAuth::sasl_digest_md5(&user, &password))
    }

    /// `zookeeper.tls.*`: off unless `zookeeper.tls.enabled`; then a CA file is required, and a
    /// client certificate comes with its key. The PEM files are checked here, so that a bad one
    /// stops zkguard at start.
    pub(super) fn zk_tls(&self) -> Result<Option<ZkTls>, ConfigError> {
        const CA: &str = "zookeeper.tls.ca";
        let enabled = self.boolean("zookeeper.tls.enabled")?;
        let client_cert = self.client_cert("zookeeper.tls.cert", "zookeeper.tls.key")?;
        let ca = self.optional_string(CA).map(PathBuf::from);
        if !enabled {
            for key in [CA, "zookeeper.tls.cert", "zookeeper.tls.key"] {
                if self.optional_string(key).is_some() {
                    return Err(self.err(
                        key,
                        "empty while zookeeper.tls.enabled is false; set zookeeper.tls.enabled=true to use TLS",
                    ));
                }
            }
            return Ok(None);
        }
        let ca = ca.ok_or_else(|| {
            self.err(
                CA,
                "a PEM file of the CA certificates that sign the ZooKeeper servers' certificates, since zookeeper.tls.enabled is true",
            )
        })?;
        security::check_pem_certificates(&ca).map_err(|e| self.err(CA, e))?;
        Ok(Some(ZkTls { ca, client_cert }))
    }

    /// `elasticsearch.tls.*`: the PEM files are checked here (a bad one stops zkguard at start).
    pub(super) fn es_tls(&self) -> Result<EsTls, ConfigError> {
        const CA: &str = "elasticsearch.tls.ca";
        let ca = self.optional_string(CA).map(PathBuf::from);
        if let Some(ca) = &ca {
            security::check_pem_certificates(ca).map_err(|e| self.err(CA, e))?;
        }
        Ok(EsTls {
            ca,
            client_cert: self.client_cert("elasticsearch.tls.cert", "elasticsearch.tls.key")?,
            verify: self.boolean("elasticsearch.tls.verify")?,
        })
    }

    /// A client certificate (`cert_key`) and its private key (`key_key`): both or neither, both
    /// valid PEM.
    fn client_cert(
        &self,
        cert_key: &str,
        key_key: &str,
    ) -> Result<Option<(PathBuf, PathBuf)>, ConfigError> {
        match (
            self.optional_string(cert_key),
            self.optional_string(key_key),
        ) {
            (None, None) => Ok(None),
            (Some(_), None) => Err(self.err(
                key_key,
                format!("the PEM private key of {cert_key}, since that is set (or unset both)"),
            )),
            (None, Some(_)) => Err(self.err(
                cert_key,
                format!("a PEM client certificate file, since {key_key} is set (or unset both)"),
            )),
            (Some(cert), Some(key)) => {
                let (cert, key) = (PathBuf::from(cert), PathBuf::from(key));
                security::check_pem_certificates(&cert).map_err(|e| self.err(cert_key, e))?;
                security::check_pem_private_key(&key).map_err(|e| self.err(key_key, e))?;
                Ok(Some((cert, key)))
            }
        }
    }

    /// The warning `elasticsearch.tls.verify=false` draws at start.
    pub(super) fn insecure_tls_warning(&self) -> Vec<String> {
        match self.boolean("elasticsearch.tls.verify") {
            Ok(false) => vec![
                "elasticsearch.tls.verify=false: the certificates of Elasticsearch servers are not checked, so anyone on the network path can impersonate them and read the credentials; set elasticsearch.tls.ca to the CA that signs them instead".into(),
            ],
            _ => Vec::new(),
        }
    }

    /// `zookeeper.acl`: `open`, `creator` (needs authentication), an explicit list, or empty for
    /// `creator` when authenticated and `open` otherwise.
    pub(super) fn zk_acl(&self, authenticated: bool) -> Result<ZkAcl, ConfigError> {
        const KEY: &str = "zookeeper.acl";
        let (v, _) = self.get(KEY);
        match v.to_ascii_lowercase().as_str() {
            "" if authenticated => Ok(ZkAcl::Creator),
            "" | "open" => Ok(ZkAcl::Open),
            "creator" if authenticated => Ok(ZkAcl::Creator),
            "creator" => Err(self.err(
                KEY,
                "open or an explicit list while zookeeper.auth.scheme is none: creator needs an authenticated session (set zookeeper.auth.scheme and its credentials)",
            )),
            _ => {
                let mut entries = Vec::new();
                for part in v.split(',').filter(|p| !p.trim().is_empty()) {
                    let entry = ZkAclEntry::parse(part).map_err(|reason| {
                        self.err(
                            KEY,
                            format!("open, creator or scheme:id:perms,... ({reason})"),
                        )
                    })?;
                    if !entries.contains(&entry) {
                        entries.push(entry);
                    }
                }
                Ok(ZkAcl::Explicit(entries))
            }
        }
    }

    /// A secret given inline (`key`) or by a file (`file_key`), not both.
    pub(super) fn secret(&self, key: &str, file_key: &str) -> Result<Option<String>, ConfigError> {
        match (self.optional_string(key), self.optional_string(file_key)) {
            (Some(_), Some(_)) => Err(self.err(
                key,
                format!("empty when {file_key} is set; give the secret once"),
            )),
            (Some(v), None) => Ok(Some(v)),
            (None, Some(path)) => self.secret_file(file_key, &path).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The content of the secret file named by `key` (`path`), trimmed of surrounding white space.
    fn secret_file(&self, key: &str, path: &str) -> Result<String, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| self.err(key, format!("a readable file holding the secret ({e})")))?;
        let text = text.trim();
        if text.is_empty() {
            return Err(self.err(key, "a file holding the secret; this one is empty"));
        }
        Ok(text.to_string())
    }

    pub(super) fn choice<'c>(
        &self,
        key: &str,
        choices: &[&'c str],
    ) -> Result<&'c str, ConfigError> {
        let v = self.get(key).0.to_ascii_lowercase();
        choices
            .iter()
            .find(|c| **c == v)
            .copied()
            .ok_or_else(|| self.err(key, format!("one of: {}", choices.join(", "))))
    }

    pub(super) fn prefix(&self, key: &str) -> Result<String, ConfigError> {
        let (v, _) = self.get(key);
        if v.is_empty() || v.len() > 32 || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(self.err(key, "1 to 32 ASCII letters, digits or underscores (e.g. A)"));
        }
        Ok(v.to_string())
    }

    pub(super) fn zk_servers(&self, key: &str) -> Result<String, ConfigError> {
        let (v, _) = self.get(key);
        check_zk_servers(v).map_err(|reason| {
            self.err(
                key,
                format!(
                    "{reason}; write host:port[,host:port...][/chroot], e.g. zk1:2181,zk2:2181/app"
                ),
            )
        })
    }

    pub(super) fn zk_root(&self, key: &str) -> Result<String, ConfigError> {
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

    pub(super) fn kafka_brokers(&self, key: &str) -> Result<Vec<String>, ConfigError> {
        let (v, _) = self.get(key);
        let mut out = Vec::new();
        for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let ok = part.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !ok {
                return Err(self.err(
                    key,
                    format!("a comma-separated list of host:port ({part:?} has no valid port), e.g. kafka1:9092,kafka2:9092"),
                ));
            }
            out.push(part.to_string());
        }
        Ok(out)
    }

    pub(super) fn kafka_name(&self, key: &str) -> Result<String, ConfigError> {
        let (v, _) = self.get(key);
        let ok = !v.is_empty()
            && v.len() <= 200
            && v != "."
            && v != ".."
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !ok {
            return Err(self.err(
                key,
                "a Kafka topic name of 1 to 200 ASCII letters, digits, - _ or .",
            ));
        }
        Ok(v.to_string())
    }

    pub(super) fn index_name(&self, key: &str) -> Result<String, ConfigError> {
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

    pub(super) fn urls(&self, key: &str) -> Result<Vec<url::Url>, ConfigError> {
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

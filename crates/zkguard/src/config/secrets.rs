//! Credentials in `elasticsearch.url` and secret values: how messages, logs, `Debug` output and
//! `zkguard config show` display them, and the warning about world-readable files that hold them.

use std::collections::HashMap;
use std::path::Path;

use super::keys::KEYS;

/// A URL (or a list of them, or text that does not parse as one) without user-info: what
/// messages, logs and `Debug` output show of `elasticsearch.url`.
#[doc(hidden)] // for the zkguard binary
pub fn redact_urls(text: &str) -> String {
    text.split(',')
        .map(|part| {
            let Some(scheme_end) = part.find("://") else {
                return part.to_string();
            };
            let rest = &part[scheme_end + 3..];
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{}{}", &part[..scheme_end + 3], &rest[at + 1..]),
                None => part.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Parsed URLs shown without user-info, comma-separated and without trailing slashes.
#[doc(hidden)] // for the zkguard binary
pub fn display_urls(urls: &[url::Url]) -> String {
    urls.iter()
        .map(|u| {
            let mut u = u.clone();
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.as_str().trim_end_matches('/').to_string()
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Takes the user-info out of `urls` and returns the basic-auth credentials to use: those of
/// `username`/`password` or those embedded in the URLs (the same in every URL that has some).
///
/// # Errors
/// A one-line reason when the URLs carry different credentials, or when both the URLs and
/// `username`/`password` give them.
pub(crate) fn split_url_credentials(
    urls: &mut [url::Url],
    username: Option<&str>,
    password: Option<&str>,
) -> Result<Option<(String, String)>, String> {
    let mut embedded: Option<(String, String)> = None;
    for u in urls.iter_mut() {
        if u.username().is_empty() && u.password().is_none() {
            continue;
        }
        let found = (
            percent_decode(u.username()),
            u.password().map(percent_decode).unwrap_or_default(),
        );
        match &embedded {
            Some(first) if *first != found => {
                return Err(
                    "the URLs carry different credentials; give them once, with elasticsearch.username and elasticsearch.password"
                        .into(),
                )
            }
            _ => embedded = Some(found),
        }
        let _ = u.set_username("");
        let _ = u.set_password(None);
    }
    let configured = username.is_some() || password.is_some();
    match embedded {
        Some(_) if configured => Err(
            "credentials are given both in the URL and by elasticsearch.username/elasticsearch.password; remove `user:password@` from the URL or unset the two keys"
                .into(),
        ),
        Some(creds) => Ok(Some(creds)),
        None => Ok(username.map(|u| (u.to_string(), password.unwrap_or_default().to_string()))),
    }
}

/// Percent-decodes the user name or password of a URL.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a key holds a secret (its name ends in password, secret, token, key or credentials).
pub fn is_secret_key(key: &str) -> bool {
    let last = key.rsplit(['.', '_', '-']).next().unwrap_or(key);
    let last = last.to_ascii_lowercase();
    ["password", "secret", "token", "key", "credentials"]
        .iter()
        .any(|s| last.ends_with(s))
}

/// `value` with secrets masked as `***` (see
/// [`EffectiveValue::value`](super::EffectiveValue::value)).
pub fn masked_value(key: &str, value: &str) -> String {
    if is_secret_key(key) {
        return if value.is_empty() {
            String::new()
        } else {
            "***".into()
        };
    }
    if !value.contains("://") {
        return value.to_string();
    }
    value
        .split(',')
        .map(|part| {
            let Some(scheme_end) = part.find("://") else {
                return part.to_string();
            };
            let rest = &part[scheme_end + 3..];
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{}***{}", &part[..scheme_end + 3], &rest[at..]),
                None => part.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A warning when the properties file `path` holds a secret (a password, an API key, digest
/// credentials or a URL with user-info) and every user may read it.
pub(super) fn world_readable_secrets(
    path: &Path,
    raw: &HashMap<String, (String, String)>,
) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let origin = path.display().to_string();
    let held: Vec<&str> = KEYS
        .iter()
        .map(|(k, _, _)| *k)
        .filter(|k| {
            raw.get(*k).is_some_and(|(v, o)| {
                *o == origin
                    && !v.is_empty()
                    && match *k {
                        "elasticsearch.password"
                        | "elasticsearch.api.key"
                        | "zookeeper.auth.credentials"
                        | "zookeeper.sasl.password" => true,
                        "elasticsearch.url" => masked_value(k, v) != *v,
                        _ => false,
                    }
            })
        })
        .collect();
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (!held.is_empty() && mode & 0o004 != 0).then(|| {
        format!(
            "configuration file {origin} holds secrets ({}) and every user may read it; restrict it (chmod 600 {origin}) or give the secrets in files of their own (the .file keys)",
            held.join(", ")
        )
    })
}

/// A value as messages show it: URLs without user-info, passwords not at all.
pub(super) fn shown_value(key: &str, value: &str) -> String {
    match key {
        "elasticsearch.url" => redact_urls(value),
        "elasticsearch.password"
        | "elasticsearch.api.key"
        | "zookeeper.auth.credentials"
        | "zookeeper.sasl.password" => "(hidden)".into(),
        _ => value.to_string(),
    }
}

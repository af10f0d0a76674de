//! Security settings: ZooKeeper authentication and the ACL of the nodes zkguard creates.

use std::fmt;

/// ZooKeeper authentication (`zookeeper.auth.*`).
///
/// Its `Debug` output hides the credentials.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkAuth {
    /// The ZooKeeper authentication scheme (`digest`).
    pub scheme: String,
    /// The credentials of the scheme (`user:password` for `digest`).
    pub credentials: String,
}

impl ZkAuth {
    /// Digest authentication with `user:password`.
    pub fn digest(credentials: impl Into<String>) -> Self {
        Self {
            scheme: "digest".into(),
            credentials: credentials.into(),
        }
    }

    /// The user name of the credentials (before the first `:`).
    pub fn user(&self) -> &str {
        self.credentials
            .split_once(':')
            .map_or(self.credentials.as_str(), |(user, _)| user)
    }
}

impl fmt::Debug for ZkAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkAuth")
            .field("scheme", &self.scheme)
            .field("user", &self.user())
            .field("credentials", &"(hidden)")
            .finish()
    }
}

/// The ACL zkguard gives the nodes it creates (`zookeeper.acl`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZkAcl {
    /// `world:anyone` with every permission: any client may delete or overwrite lock nodes.
    Open,
    /// Every permission for the identities the creating session authenticated with, none for
    /// anyone else.
    Creator,
    /// An explicit list (`digest:ops:<hash>:cdrwa,world:anyone:r`).
    Explicit(Vec<ZkAclEntry>),
}

/// One entry of an explicit [`ZkAcl`]: `scheme:id:perms`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub struct ZkAclEntry {
    /// The scheme (`world`, `digest`, `ip`, `x509`, `sasl`).
    pub scheme: String,
    /// The id within the scheme (`anyone`, `ops:<base64 sha1>`, `10.0.0.0/8`).
    pub id: String,
    /// Permissions, a set of the letters `c` (create children), `d` (delete children), `r`
    /// (read), `w` (write data), `a` (admin), in that order.
    pub perms: String,
}

impl ZkAclEntry {
    /// Parses `scheme:id:perms` (the id may itself hold colons, as digest ids do).
    ///
    /// # Errors
    /// What is wrong with the entry.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (scheme, rest) = text
            .split_once(':')
            .ok_or_else(|| format!("`{text}` is not scheme:id:perms"))?;
        let (id, perms) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("`{text}` is not scheme:id:perms"))?;
        if scheme == "auth" {
            return Err(format!(
                "`{text}`: use zookeeper.acl=creator for the creator's identities"
            ));
        }
        if scheme.is_empty() || id.is_empty() {
            return Err(format!("`{text}` is not scheme:id:perms"));
        }
        if perms.is_empty() || !perms.chars().all(|c| "cdrwa".contains(c)) {
            return Err(format!(
                "`{text}`: permissions are letters among c, d, r, w, a"
            ));
        }
        let perms = "cdrwa".chars().filter(|c| perms.contains(*c)).collect();
        Ok(Self {
            scheme: scheme.to_string(),
            id: id.to_string(),
            perms,
        })
    }
}

impl fmt::Display for ZkAclEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.scheme, self.id, self.perms)
    }
}

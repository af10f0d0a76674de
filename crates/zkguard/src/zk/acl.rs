//! The ACL of the nodes zkguard creates (`zookeeper.acl`), and the check that an existing lock
//! root carries it.

use zookeeper_client::{Acl, Acls, AuthId, Client, Error as ZkError, Permission};

use super::map_zk;
use crate::config::{ZkAcl, ZkAuth};
use crate::lock::LockError;

const LETTERS: [(char, Permission); 5] = [
    ('c', Permission::CREATE),
    ('d', Permission::DELETE),
    ('r', Permission::READ),
    ('w', Permission::WRITE),
    ('a', Permission::ADMIN),
];

/// The client's ACL list for `acl`.
pub(super) fn acl_list(acl: &ZkAcl) -> Vec<Acl> {
    match acl {
        ZkAcl::Open => Acls::anyone_all().to_vec(),
        ZkAcl::Creator => Acls::creator_all().to_vec(),
        ZkAcl::Explicit(entries) => entries
            .iter()
            .map(|e| {
                let perms = LETTERS
                    .iter()
                    .filter(|(c, _)| e.perms.contains(*c))
                    .fold(Permission::NONE, |p, (_, q)| p | *q);
                Acl::new(perms, AuthId::new(&e.scheme, &e.id))
            })
            .collect(),
    }
}

fn perms_letters(p: Permission) -> String {
    LETTERS
        .iter()
        .filter(|(_, q)| p.has(*q))
        .map(|(c, _)| *c)
        .collect()
}

fn show(acls: &[Acl]) -> String {
    acls.iter()
        .map(|a| {
            format!(
                "{}:{}:{}",
                a.scheme(),
                a.id(),
                perms_letters(a.permission())
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether an ACL read from ZooKeeper (`found`) is the one `acl` creates. `creator` is stored
/// by the server as the creator's identities with every permission.
fn matches(found: &[Acl], acl: &ZkAcl, auth: Option<&ZkAuth>) -> bool {
    let key = |a: &Acl| {
        (
            a.scheme().to_string(),
            a.id().to_string(),
            perms_letters(a.permission()),
        )
    };
    match acl {
        ZkAcl::Creator => {
            !found.is_empty()
                && found.iter().all(|a| {
                    a.permission() == Permission::ALL
                        && match auth {
                            // SASL ids are the user name; digest ids `user:<hash>`.
                            Some(auth) if auth.is_sasl() => {
                                a.scheme() == "sasl" && a.id() == auth.user()
                            }
                            Some(auth) => {
                                a.scheme() == auth.scheme
                                    && a.id().starts_with(&format!("{}:", auth.user()))
                            }
                            None => a.scheme() != "world",
                        }
                })
        }
        _ => {
            let mut found: Vec<_> = found.iter().map(key).collect();
            let mut wanted: Vec<_> = acl_list(acl).iter().map(key).collect();
            found.sort();
            wanted.sort();
            found == wanted
        }
    }
}

/// Fails with [`LockError::LockRootAcl`] when the lock root exists with another ACL than the
/// configured one (a missing root is created with the configured ACL later).
pub(super) async fn check_lock_root(
    client: &Client,
    root: &str,
    acl: &ZkAcl,
    auth: Option<&ZkAuth>,
) -> Result<(), LockError> {
    let found = match client.get_acl(root).await {
        Ok((found, _)) => found,
        Err(ZkError::NoNode) => return Ok(()),
        Err(e) => return Err(map_zk(e, "reading the ACL of the lock root")),
    };
    if matches(&found, acl, auth) {
        return Ok(());
    }
    let expected = match acl {
        ZkAcl::Creator => match auth {
            Some(auth) if auth.is_sasl() => format!("creator: sasl:{}:cdrwa", auth.user()),
            Some(auth) => format!("creator: {}:{}:<hash>:cdrwa", auth.scheme, auth.user()),
            None => "creator".into(),
        },
        other => show(&acl_list(other)),
    };
    Err(LockError::LockRootAcl {
        root: root.to_string(),
        found: show(&found),
        expected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ZkAclEntry;

    #[test]
    fn an_acl_read_back_matches_the_configured_one() {
        let alice = ZkAuth::digest("alice:pw");
        let stored = [Acl::new(
            Permission::ALL,
            AuthId::new("digest", "alice:aGFzaA=="),
        )];
        assert!(matches(&stored, &ZkAcl::Creator, Some(&alice)));
        assert!(!matches(
            &stored,
            &ZkAcl::Creator,
            Some(&ZkAuth::digest("bob:pw"))
        ));
        assert!(!matches(&stored, &ZkAcl::Open, Some(&alice)));
        assert!(matches(&Acls::anyone_all(), &ZkAcl::Open, None));
        assert!(!matches(&Acls::anyone_all(), &ZkAcl::Creator, Some(&alice)));
        let sasl_alice = ZkAuth::sasl_digest_md5("alice", "pw");
        let sasl_stored = [Acl::new(Permission::ALL, AuthId::new("sasl", "alice"))];
        assert!(matches(&sasl_stored, &ZkAcl::Creator, Some(&sasl_alice)));
        assert!(!matches(&stored, &ZkAcl::Creator, Some(&sasl_alice)));
        assert!(!matches(&sasl_stored, &ZkAcl::Creator, Some(&alice)));
        let explicit = ZkAcl::Explicit(vec![
            ZkAclEntry::parse("world:anyone:r").unwrap(),
            ZkAclEntry::parse("digest:alice:aGFzaA==:cdrwa").unwrap(),
        ]);
        let mut both = stored.to_vec();
        both.push(Acl::new(Permission::READ, AuthId::anyone()));
        assert!(matches(&both, &explicit, Some(&alice)));
        assert!(!matches(&stored, &explicit, Some(&alice)));
        assert_eq!(show(&both), "digest:alice:aGFzaA==:cdrwa,world:anyone:r");
    }
}

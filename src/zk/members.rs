//! Groups of live members: one ephemeral node per member under
//! `<zookeeper.lock.root>-members/<group>`, gone with its session. `zkguard serve` registers
//! each instance of a fleet this way, so that each takes a fair share of the Kafka journal's
//! partitions (`src/server/journal/kafka/`).

use zookeeper_client::{Acls, CreateMode, Error as ZkError};

use super::{map_zk, ZkSession};
use crate::lock::LockError;

impl ZkSession {
    /// The node under which `group`'s members register.
    pub fn members_path(&self, group: &str) -> String {
        format!("{}-members/{group}", self.settings().lock_root)
    }

    /// Registers `member` in `group` (an ephemeral node of this session), creating the group's
    /// parents when missing. Registering again while registered is a no-op; after a session
    /// expiry the node is gone and this registers it again.
    ///
    /// # Errors
    /// Connection and session errors; [`LockError::Backend`] for a name ZooKeeper refuses.
    pub async fn join_members(&self, group: &str, member: &str) -> Result<(), LockError> {
        let slot = self.slot().await?;
        let client = &slot.client;
        let acl = super::acl::acl_list(&self.settings().acl);
        let dir = self.members_path(group);
        let node = format!("{dir}/{member}");
        let persistent = CreateMode::Persistent.with_acls(Acls::new(&acl));
        // The parents, one level at a time (an existing one is fine).
        let mut at = String::new();
        for part in dir.split('/').filter(|p| !p.is_empty()) {
            at.push('/');
            at.push_str(part);
            match client.create(&at, &[], &persistent).await {
                Ok(_) | Err(ZkError::NodeExists) => {}
                Err(e) => return Err(map_zk(e, "creating the members' node")),
            }
        }
        let ephemeral = CreateMode::Ephemeral.with_acls(Acls::new(&acl));
        match client.create(&node, &[], &ephemeral).await {
            Ok(_) => Ok(()),
            Err(ZkError::NodeExists) => {
                // Ours (a registration made before), or a previous session's not expired yet:
                // the latter goes with that session, and the next call registers again.
                match client.check_stat(&node).await {
                    Ok(Some(stat)) if stat.ephemeral_owner == slot.session_id => Ok(()),
                    Ok(_) => Err(LockError::Backend {
                        context: "registering as a member".into(),
                        detail: format!("{node} belongs to another session (a previous run of this instance whose session has not expired yet, or another instance with the same name)"),
                    }),
                    Err(e) => Err(map_zk(e, "reading a member's node")),
                }
            }
            Err(e) => Err(map_zk(e, "registering as a member")),
        }
    }

    /// The live members of `group`, sorted (empty when none registered yet).
    ///
    /// # Errors
    /// Connection and session errors.
    pub async fn members(&self, group: &str) -> Result<Vec<String>, LockError> {
        let slot = self.slot().await?;
        match slot.client.list_children(&self.members_path(group)).await {
            Ok(mut names) => {
                names.sort();
                Ok(names)
            }
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(e) => Err(map_zk(e, "listing the members")),
        }
    }
}

//! The token space: what a fencing token is, for both lock backends and the writes they fence.
//! It sits beside the sans-IO core because it is the protocol's fact, not one backend's: the
//! ZooKeeper lock's tokens are the transaction id that granted the lock, lifted above every
//! version a document can have been given without zkguard; the Elasticsearch lease lock draws
//! its tokens from the same space (at least [`TOKEN_BASE`]); the write path tells a zkguard token
//! from an outside version by [`is_token`].
//!
//! A transaction id only grows (`epoch << 32 | counter`), but a standalone server starts it near
//! zero: the first tokens would be 7, 11, 15…, below the `_version` of any document that was
//! written a few times without zkguard or versioned by another tool, and such documents would
//! fence every guarded write. Adding [`TOKEN_BASE`] (2^52, about 4.5 x 10^15) puts every token
//! above Elasticsearch's internal versions (one per write), above millisecond and microsecond
//! timestamps until the year 2112, and above the tokens of earlier zkguard releases (the bare
//! transaction id), so an upgrade never makes tokens go backwards. The base is part of the
//! token's contract: it is never lowered.
//!
//! Tokens stay below 2^53 (JavaScript's largest exact integer, so Node clients read `_version`
//! exactly) while the ensemble's epoch stays below 2^20 leader elections.

/// What the ZooKeeper lock adds to a transaction id to make its fencing token; the smallest
/// token of either lock backend.
pub const TOKEN_BASE: u64 = 1 << 52;

/// Whether `version` lies in zkguard's token space (from [`TOKEN_BASE`] up to, not including,
/// twice it): a version set by a zkguard lock holder rather than outside zkguard.
pub fn is_token(version: u64) -> bool {
    (TOKEN_BASE..TOKEN_BASE << 1).contains(&version)
}

/// The fencing token of a lock granted by transaction `zxid`.
pub fn from_zxid(zxid: u64) -> u64 {
    TOKEN_BASE.saturating_add(zxid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_keep_the_order_of_transaction_ids_and_stay_above_earlier_releases() {
        let zxids = [0u64, 7, 11, 4_294_967_297, 5 << 32 | 12];
        for w in zxids.windows(2) {
            assert!(from_zxid(w[0]) < from_zxid(w[1]));
        }
        // Earlier releases used the transaction id itself.
        assert!(zxids.iter().all(|&z| from_zxid(0) > z));
        // A millisecond timestamp of today, and JavaScript's exact range for an epoch of 1000.
        assert!(from_zxid(0) > 1_763_900_000_000_000);
        assert!(from_zxid(1000 << 32 | u32::MAX as u64) < 1 << 53);
    }
}

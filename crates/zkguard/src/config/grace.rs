//! The safe bound of `zookeeper.lock.loss.grace` (see `docs/zookeeper-lock.md`, "How long a
//! holder may believe in its lock").
//!
//! A holder counts its lock as lost `grace` after the send instant of the last request that the
//! ZooKeeper quorum answered for its session (a confirmation `sync`, or the acquisition itself).
//! The leader expires a session no earlier than the session timeout after it last heard of it;
//! when the holder's server is a follower, the leader hears of the holder's requests only in the
//! follower's answers to its pings (every `tickTime / 2`, at most a quarter of the session
//! timeout since the server allows no session shorter than `2 x tickTime`), and a follower cut
//! off right after answering may not report the last of them at all: the leader's newest news of
//! the session can be as old as the client's longest silence (it pings after three ticks without
//! sending, checked every tick) before that ping. Hence
//!
//! `grace <= 3/4 x session timeout - longest client silence - 1/20 x session timeout`
//!
//! where the last term is a margin for network delays and scheduling.
//!
//! The default grace is that bound: a lock counts as lost only once the session may have
//! expired, never because the holder was merely slow (a busy machine that answers a confirmation
//! late). It is not longer, although Elasticsearch writes are fenced: fencing orders writes, not
//! reads (a stale holder's write between the new holder's read and write is lost once
//! acknowledged), and much of what a holder does (`zkguard exec`, an application's critical
//! section) is not a fenced write at all.

use std::time::Duration;

/// The least time zkguard gives a connection to one server with TLS (handshake included): the
/// client's connection timeout is this or 2/5 of the session timeout, whichever is longer.
pub const TLS_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The connection timeout zkguard gives the client with TLS, for a session timeout.
pub fn tls_connection_timeout(session_timeout: Duration) -> Duration {
    TLS_CONNECT_TIMEOUT.max(session_timeout * 2 / 5)
}

/// The tick of `zookeeper-client`'s session loop (as in its `calc_tick_timeout`): a twentieth of
/// the negotiated session timeout, or an eighth of a configured connection timeout that is at
/// most 3/5 of it. `None`: no connection timeout configured.
pub fn client_tick(session_timeout: Duration, connection_timeout: Option<Duration>) -> Duration {
    let tick = match connection_timeout {
        Some(c) if !c.is_zero() && c <= session_timeout * 3 / 5 => c / 8,
        _ => session_timeout / 20,
    };
    tick.max(Duration::from_millis(1))
}

/// The longest time the client goes without sending anything while connected: it pings once
/// `min(10 s, 3 ticks)` passed since it last sent, which it checks every tick.
pub fn client_silence(session_timeout: Duration, connection_timeout: Option<Duration>) -> Duration {
    let tick = client_tick(session_timeout, connection_timeout);
    Duration::from_secs(10).min(3 * tick) + tick
}

/// The longest safe `zookeeper.lock.loss.grace` for a session timeout (the negotiated one, or the
/// configured one at load) and the client's connection timeout (`None`: not configured; an
/// application's connector whose timeout is unknown is taken at its worst, 3/5 of the session
/// timeout). See the module documentation for the derivation.
pub fn max_loss_grace(session_timeout: Duration, connection_timeout: Option<Duration>) -> Duration {
    (session_timeout * 3 / 4)
        .saturating_sub(client_silence(session_timeout, connection_timeout))
        .saturating_sub(session_timeout / 20)
}

/// How the bound of [`max_loss_grace`] is made up, for messages: `3/4 x 2000ms - 400ms (the
/// client's longest silence) - 100ms (margin) = 1000ms`.
pub fn describe_max_loss_grace(
    session_timeout: Duration,
    connection_timeout: Option<Duration>,
) -> String {
    format!(
        "3/4 x {}ms - {}ms (the client's longest silence between pings) - {}ms (margin, 1/20 of the session timeout) = {}ms",
        session_timeout.as_millis(),
        client_silence(session_timeout, connection_timeout).as_millis(),
        (session_timeout / 20).as_millis(),
        max_loss_grace(session_timeout, connection_timeout).as_millis()
    )
}

/// The grace a session uses: the configured one (`None`: [`max_loss_grace`], the latest moment
/// at which the session cannot have expired yet), never above [`max_loss_grace`]. The second
/// value is true when a configured grace was cut down to the bound.
pub fn effective_loss_grace(
    configured: Option<Duration>,
    session_timeout: Duration,
    connection_timeout: Option<Duration>,
) -> (Duration, bool) {
    let bound = max_loss_grace(session_timeout, connection_timeout);
    match configured {
        Some(g) if g > bound => (bound, true),
        Some(g) => (g, false),
        None => (bound, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn without_tls_the_bound_is_half_the_session_timeout() {
        for t in [1000, 2000, 4000, 5000, 30_000] {
            assert_eq!(max_loss_grace(ms(t), None), ms(t / 2), "{t}");
            // The default is the bound: no lock is lost while the session cannot have expired.
            assert_eq!(effective_loss_grace(None, ms(t), None), (ms(t / 2), false));
        }
    }

    #[test]
    fn with_tls_the_longer_ticks_of_a_3s_connection_timeout_lower_it() {
        let t = ms(5000);
        let c = Some(tls_connection_timeout(t));
        assert_eq!(c, Some(ms(3000)));
        assert_eq!(client_tick(t, c), ms(375));
        assert_eq!(client_silence(t, c), ms(1500));
        assert_eq!(max_loss_grace(t, c), ms(2000));
        assert_eq!(effective_loss_grace(None, t, c), (ms(2000), false));
        // Below 5 s the 3 s connection timeout exceeds 3/5 of the session: ticks of T/20.
        assert_eq!(max_loss_grace(ms(4000), Some(ms(3000))), ms(2000));
    }

    #[test]
    fn a_configured_grace_above_the_bound_is_cut_down() {
        assert_eq!(
            effective_loss_grace(Some(ms(1900)), ms(2000), None),
            (ms(1000), true)
        );
        assert_eq!(
            effective_loss_grace(Some(ms(900)), ms(2000), None),
            (ms(900), false)
        );
        assert_eq!(
            describe_max_loss_grace(ms(2000), None),
            "3/4 x 2000ms - 400ms (the client's longest silence between pings) - 100ms (margin, 1/20 of the session timeout) = 1000ms"
        );
    }

    #[test]
    fn long_sessions_ping_at_most_10s_apart() {
        // T = 300 s: ticks of 15 s, a ping after 10 s of silence, checked every 15 s.
        assert_eq!(client_silence(ms(300_000), None), ms(25_000));
        assert_eq!(max_loss_grace(ms(300_000), None), ms(185_000));
    }
}

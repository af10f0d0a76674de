//! What the status page (`GET /ui`) shares between its viewers: the dead-letter listing, read
//! at most every [`DEAD_LETTERS_FRESH`] however many pages are open, and the address this
//! instance listens on (which the page names).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use zkguard::write::deadletter::{DeadLetter, DeadLetterSink};

/// How long a listing of the dead-letter sink serves every viewer (a replay or a discard
/// through the API forgets it at once): a sink that reads a file or a topic is read at most
/// this often.
pub const DEAD_LETTERS_FRESH: Duration = Duration::from_secs(2);

/// A listing of the dead-letter sink, or why it could not be read.
pub type Letters = Arc<Result<Vec<DeadLetter>, String>>;

/// The dead-letter listing shared by the page's viewers for [`DEAD_LETTERS_FRESH`].
#[derive(Debug, Default)]
pub struct UiCache {
    letters: Mutex<Option<(Instant, Letters)>>,
    listening: OnceLock<String>,
}

impl UiCache {
    /// Records the address the service listens on (once bound).
    pub fn set_listening(&self, address: String) {
        let _ = self.listening.set(address);
    }

    /// The address the service listens on, once bound.
    pub fn listening(&self) -> Option<&str> {
        self.listening.get().map(String::as_str)
    }

    /// Forgets the dead-letter listing (after a replay or a discard).
    pub fn forget_deadletters(&self) {
        *self.letters.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The entries of `sink`, oldest first, as listed within [`DEAD_LETTERS_FRESH`].
    pub async fn deadletters(&self, sink: &dyn DeadLetterSink) -> Letters {
        if let Some((at, listed)) = &*self.letters.lock().unwrap_or_else(|p| p.into_inner()) {
            if at.elapsed() < DEAD_LETTERS_FRESH {
                return listed.clone();
            }
        }
        let listed = Arc::new(sink.list().await.map_err(|e| e.to_string()));
        *self.letters.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), listed.clone()));
        listed
    }
}

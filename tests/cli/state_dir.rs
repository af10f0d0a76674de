//! Where zkguard keeps its own files when their paths are relative (the defaults): in the state
//! directory, so that every command finds them whatever its working directory, and the messages
//! name the absolute path they read.

use std::process::Stdio;
use std::time::{Duration, SystemTime};

use zkguard::write::deadletter::{DeadLetter, DeadLetterSink, FileSink};
use zkguard::write::guarded::GuardedError;
use zkguard::write::ops::Operation;
use zkguard::{LockError, LockType};

fn zkguard_in(
    cwd: &std::path::Path,
    state: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    let mut cmd = crate::cli::zkguard();
    cmd.current_dir(cwd)
        .env("XDG_STATE_HOME", state)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run zkguard")
}

#[tokio::test]
async fn dead_letters_parked_under_the_default_path_are_listed_from_any_directory() {
    let state = tempfile::tempdir().unwrap();
    let (here, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let file = state
        .path()
        .join("zkguard")
        .join("zkguard-deadletters.jsonl");

    // Nothing parked yet: the message names the absolute path it read.
    let empty = zkguard_in(here.path(), state.path(), &["dlq", "list"]);
    let text = String::from_utf8_lossy(&empty.stdout).into_owned();
    assert_eq!(empty.status.code(), Some(0), "{text}");
    assert!(text.contains(&file.display().to_string()), "{text}");

    // Parked where a run from `here` parks by default...
    let sink = FileSink::new(&file);
    let op = Operation::increment("m", "idx", "1", "n", 1).with_type(LockType::Background);
    let err = GuardedError::Lock(LockError::Timeout {
        monitor: "m".into(),
        lock_type: LockType::Background,
        waited: Duration::from_millis(300),
        blocked_by: None,
    });
    let now = SystemTime::now();
    sink.park(&DeadLetter::new(&op, 3, &err, now, now))
        .await
        .unwrap();
    // ... and listed from anywhere else.
    for cwd in [here.path(), elsewhere.path()] {
        let listed = zkguard_in(cwd, state.path(), &["dlq", "list"]);
        let text = String::from_utf8_lossy(&listed.stdout).into_owned();
        assert_eq!(listed.status.code(), Some(0), "{text}");
        assert!(text.contains(&op.id.to_string()), "from {cwd:?}: {text}");
    }
    assert!(
        std::fs::read_dir(here.path()).unwrap().next().is_none()
            && std::fs::read_dir(elsewhere.path())
                .unwrap()
                .next()
                .is_none(),
        "nothing is written to the working directory"
    );
}

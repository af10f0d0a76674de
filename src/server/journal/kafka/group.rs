//! Group commit of the Kafka journal's produce requests, one [`Group`] per partition.
//!
//! While a produce request of a partition waits for the broker's acknowledgement, the records
//! of the requests accepted meanwhile wait in a queue; once it is acknowledged, all of them go
//! in the next produce request (up to [`MAX_GROUP_BYTES`]), so that concurrent background writes
//! share one round trip (and one append) instead of queueing one produce each behind the
//! others. A request's records are never split between two produce requests (the broker
//! appends a produce request whole or not at all), they keep the order in which the requests
//! reached the queue, and each request learns the outcome of the produce request that carried
//! it: its 202 still waits for the broker's acknowledgement (`acks=all`) of its own records.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio::sync::oneshot;

/// Most bytes (of record values) one produce request carries when it groups several accepted
/// requests: half the broker's default `message.max.bytes` (1 MiB), so that a group stays under
/// it. A single request larger than this is still produced whole, alone.
pub(super) const MAX_GROUP_BYTES: usize = 512 * 1024;

/// Sends one produce request and returns once the broker acknowledged it, or why not.
pub(super) type Produce<T> =
    Arc<dyn Fn(Vec<T>) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// The produce requests of one partition (see the module documentation).
pub(super) struct Group<T> {
    queue: Mutex<Queue<T>>,
    send: Produce<T>,
    max_bytes: usize,
}

struct Queue<T> {
    waiting: VecDeque<Waiting<T>>,
    /// Whether a task is producing this partition's queue.
    busy: bool,
}

/// Where a request learns the outcome of the produce request that carried its records.
type Done = oneshot::Sender<Result<(), String>>;

/// One accepted request's records, waiting for their produce request.
struct Waiting<T> {
    items: Vec<T>,
    bytes: usize,
    done: Done,
}

impl<T: Send + 'static> Group<T> {
    /// A group sending its produce requests with `send`, each grouping requests up to
    /// `max_bytes` (a single larger request goes alone).
    pub(super) fn new(send: Produce<T>, max_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                busy: false,
            }),
            send,
            max_bytes,
        })
    }

    /// Produces `items` (`bytes` in all) in the next produce request of the partition, and
    /// returns that request's outcome. The records are produced even if the caller stops
    /// waiting.
    pub(super) async fn produce(
        self: &Arc<Self>,
        items: Vec<T>,
        bytes: usize,
    ) -> Result<(), String> {
        let (done, outcome) = oneshot::channel();
        let start = {
            let mut q = super::parts::lock(&self.queue);
            q.waiting.push_back(Waiting { items, bytes, done });
            !std::mem::replace(&mut q.busy, true)
        };
        if start {
            tokio::spawn(self.clone().drain());
        }
        outcome
            .await
            .unwrap_or_else(|_| Err("the produce request was abandoned".to_string()))
    }

    /// Produces the queue, one group at a time, until it is empty.
    async fn drain(self: Arc<Self>) {
        while let Some((items, dones)) = self.next_group() {
            let outcome = (self.send)(items).await;
            for done in dones {
                let _ = done.send(outcome.clone());
            }
        }
    }

    /// Takes the requests of the next produce request from the queue: the first one, and those
    /// after it while they fit in `max_bytes`. `None` (and not busy any more) when it is empty.
    fn next_group(&self) -> Option<(Vec<T>, Vec<Done>)> {
        let mut q = super::parts::lock(&self.queue);
        let Some(first) = q.waiting.pop_front() else {
            q.busy = false;
            return None;
        };
        let mut bytes = first.bytes;
        let mut items = first.items;
        let mut dones = vec![first.done];
        while let Some(next) = q.waiting.front() {
            if bytes + next.bytes > self.max_bytes {
                break;
            }
            let next = q.waiting.pop_front().expect("the front is there");
            bytes += next.bytes;
            items.extend(next.items);
            dones.push(next.done);
        }
        Some((items, dones))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::Semaphore;

    /// The produce requests sent, in order, each with its records.
    type Sent = Arc<Mutex<Vec<Vec<u32>>>>;

    /// A partition whose produce requests are recorded, each held until `gate` lets it through,
    /// failing when it carries `fail_on`.
    fn recording(gate: Arc<Semaphore>, fail_on: Option<u32>) -> (Arc<Group<u32>>, Sent) {
        let sent: Sent = Arc::default();
        let log = sent.clone();
        let send: Produce<u32> = Arc::new(move |items: Vec<u32>| {
            let gate = gate.clone();
            let log = log.clone();
            Box::pin(async move {
                gate.acquire().await.expect("open").forget();
                let failed = fail_on.is_some_and(|f| items.contains(&f));
                log.lock().unwrap().push(items);
                if failed {
                    Err("refused".to_string())
                } else {
                    Ok(())
                }
            })
        });
        (Group::new(send, 10), sent)
    }

    /// Waits until a produce request is in flight and nothing waits behind it.
    async fn in_flight(group: &Group<u32>) {
        loop {
            {
                let q = super::super::parts::lock(&group.queue);
                if q.busy && q.waiting.is_empty() {
                    return;
                }
            }
            tokio::task::yield_now().await;
        }
    }

    /// Waits until `n` requests wait in the queue behind the produce request in flight.
    async fn queued(group: &Group<u32>, n: usize) {
        while super::super::parts::lock(&group.queue).waiting.len() < n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn requests_accepted_while_a_produce_waits_share_the_next_one_in_order() {
        let gate = Arc::new(Semaphore::new(0));
        let (group, sent) = recording(gate.clone(), None);
        let first = tokio::spawn({
            let g = group.clone();
            async move { g.produce(vec![1], 1).await }
        });
        in_flight(&group).await;
        let answered = Arc::new(AtomicUsize::new(0));
        let mut later = Vec::new();
        for items in [vec![2, 3], vec![4], vec![5, 6]] {
            let g = group.clone();
            let answered = answered.clone();
            later.push(tokio::spawn(async move {
                let n = items.len();
                let r = g.produce(items, n).await;
                answered.fetch_add(1, Ordering::SeqCst);
                r
            }));
            queued(&group, later.len()).await;
        }
        // Nothing is answered before its own produce request is acknowledged.
        tokio::task::yield_now().await;
        assert_eq!(answered.load(Ordering::SeqCst), 0);
        assert!(!first.is_finished());
        gate.add_permits(1);
        assert_eq!(first.await.unwrap(), Ok(()));
        assert_eq!(answered.load(Ordering::SeqCst), 0);
        gate.add_permits(1);
        for t in later {
            assert_eq!(t.await.unwrap(), Ok(()));
        }
        assert_eq!(*sent.lock().unwrap(), vec![vec![1], vec![2, 3, 4, 5, 6]]);
        assert!(!super::super::parts::lock(&group.queue).busy);
    }

    #[tokio::test]
    async fn a_group_stops_at_its_byte_limit_without_splitting_a_request() {
        let gate = Arc::new(Semaphore::new(0));
        let (group, sent) = recording(gate.clone(), None);
        let mut all = vec![tokio::spawn({
            let g = group.clone();
            async move { g.produce(vec![0], 1).await }
        })];
        in_flight(&group).await;
        // Limit 10: [1..=6] (6) + [7,8,9] (3) fit; [10, 11] would pass it; [12..=23] is
        // larger than the limit alone and goes whole.
        let requests: Vec<Vec<u32>> = vec![
            (1..=6).collect(),
            vec![7, 8, 9],
            vec![10, 11],
            (12..=23).collect(),
        ];
        for (i, items) in requests.into_iter().enumerate() {
            let g = group.clone();
            all.push(tokio::spawn(async move {
                let n = items.len();
                g.produce(items, n).await
            }));
            queued(&group, i + 1).await;
        }
        gate.add_permits(10);
        for t in all {
            assert_eq!(t.await.unwrap(), Ok(()));
        }
        assert_eq!(
            *sent.lock().unwrap(),
            vec![
                vec![0],
                (1..=9).collect::<Vec<_>>(),
                vec![10, 11],
                (12..=23).collect::<Vec<_>>()
            ]
        );
    }

    #[tokio::test]
    async fn every_request_of_a_refused_produce_is_refused_and_the_next_ones_go_on() {
        let gate = Arc::new(Semaphore::new(0));
        let (group, _sent) = recording(gate.clone(), Some(3));
        let first = tokio::spawn({
            let g = group.clone();
            async move { g.produce(vec![1], 1).await }
        });
        in_flight(&group).await;
        let a = tokio::spawn({
            let g = group.clone();
            async move { g.produce(vec![2], 1).await }
        });
        queued(&group, 1).await;
        let b = tokio::spawn({
            let g = group.clone();
            async move { g.produce(vec![3], 1).await }
        });
        queued(&group, 2).await;
        gate.add_permits(2);
        assert_eq!(first.await.unwrap(), Ok(()));
        assert_eq!(a.await.unwrap(), Err("refused".to_string()));
        assert_eq!(b.await.unwrap(), Err("refused".to_string()));
        gate.add_permits(1);
        assert_eq!(group.produce(vec![4], 1).await, Ok(()));
    }
}

//! Queue-node names and their order.
//!
//! A contender's node is `<prefix>-<sequence>`: its class prefix (`A` foreground, `B`
//! background by default), a dash, and ZooKeeper's 10-digit sequence. Order is (prefix,
//! sequence as a number): every node of a lower prefix goes before every node of a higher one,
//! and within a prefix the older node goes first.

use std::cmp::Ordering;

/// The name of the mutex node under each monitor.
pub const MUTEX_NODE: &str = "privateLock";

/// A parsed queue node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueNode {
    /// Full child name, e.g. `A-0000000012`.
    pub name: String,
    /// Class prefix, e.g. `A`.
    pub prefix: String,
    /// ZooKeeper sequence number.
    pub sequence: u64,
}

impl QueueNode {
    /// Parses `<prefix>-<10 digits>`; `None` for anything else (`privateLock`, foreign nodes).
    pub fn parse(name: &str) -> Option<Self> {
        let (prefix, seq) = name.rsplit_once('-')?;
        if prefix.is_empty() || seq.len() < 10 || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self {
            name: name.to_string(),
            prefix: prefix.to_string(),
            sequence: seq.parse().ok()?,
        })
    }

    /// The name a node of the same class would have if it had been created two sequence
    /// numbers before this one (`A-0000000010` for `A-0000000012`); `None` below 2.
    pub fn two_before(&self) -> Option<String> {
        let sequence = self.sequence.checked_sub(2)?;
        Some(format!("{}-{sequence:010}", self.prefix))
    }

    /// Queue order: prefix first, then sequence.
    pub fn order(&self, other: &Self) -> Ordering {
        self.prefix
            .cmp(&other.prefix)
            .then(self.sequence.cmp(&other.sequence))
    }
}

/// The children of a monitor node, understood.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Queue {
    /// Contenders in lock order.
    pub nodes: Vec<QueueNode>,
    /// Whether `privateLock` exists.
    pub mutex_present: bool,
}

impl Queue {
    /// Parses and sorts a child list.
    pub fn from_children<S: AsRef<str>>(children: &[S]) -> Self {
        let mut nodes: Vec<QueueNode> = children
            .iter()
            .filter_map(|c| QueueNode::parse(c.as_ref()))
            .collect();
        nodes.sort_by(QueueNode::order);
        let mutex_present = children.iter().any(|c| c.as_ref() == MUTEX_NODE);
        Self {
            nodes,
            mutex_present,
        }
    }

    /// Position of `name` in lock order.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// The node `name` should wait for (the one just before it), if any.
    pub fn predecessor(&self, name: &str) -> Option<&QueueNode> {
        let pos = self.position(name)?;
        pos.checked_sub(1).map(|p| &self.nodes[p])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_design_names() {
        let n = QueueNode::parse("A-0000000001").unwrap();
        assert_eq!((n.prefix.as_str(), n.sequence), ("A", 1));
        assert!(QueueNode::parse("privateLock").is_none());
        assert!(QueueNode::parse("A-12").is_none());
        assert!(QueueNode::parse("-0000000001").is_none());
        // Sequence overflow past 10 digits (ZooKeeper prints a negative int then; 11 digits here).
        assert_eq!(QueueNode::parse("B-00000000012").unwrap().sequence, 12);
    }

    #[test]
    fn two_before_keeps_the_class_and_the_width() {
        let n = QueueNode::parse("B-0000000012").unwrap();
        assert_eq!(n.two_before().as_deref(), Some("B-0000000010"));
        assert_eq!(QueueNode::parse("A-0000000001").unwrap().two_before(), None);
    }

    #[test]
    fn a_prefix_that_begins_another_parses_apart() {
        // Prefixes have no dash (the configuration refuses one), so the last dash ends the
        // prefix: `A` and `AA` are two classes, `A` first.
        let q = Queue::from_children(&["AA-0000000001", "A-0000000002"]);
        let parsed: Vec<_> = q
            .nodes
            .iter()
            .map(|n| (n.prefix.as_str(), n.sequence))
            .collect();
        assert_eq!(parsed, [("A", 2), ("AA", 1)]);
    }

    #[test]
    fn scenario_three_order() {
        // Client1 holds A-1, Client2 queued B-2, Client3 arrives with A-3: A-3 goes before B-2.
        let q = Queue::from_children(&[
            "B-0000000002",
            "privateLock",
            "A-0000000003",
            "A-0000000001",
        ]);
        let names: Vec<_> = q.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["A-0000000001", "A-0000000003", "B-0000000002"]);
        assert!(q.mutex_present);
        assert_eq!(q.predecessor("B-0000000002").unwrap().name, "A-0000000003");
        assert!(q.predecessor("A-0000000001").is_none());
    }

    fn node() -> impl Strategy<Value = (String, u64)> {
        (
            prop::sample::select(vec!["A", "B", "C", "AA"]).prop_map(String::from),
            0u64..10_000_000_000,
        )
    }

    proptest! {
        /// The order is total, agrees with (prefix, numeric sequence), and does not depend on
        /// the order in which ZooKeeper lists children.
        #[test]
        fn order_is_prefix_then_number(mut raw in prop::collection::vec(node(), 1..40), seed in any::<u64>()) {
            raw.sort();
            raw.dedup_by(|a, b| a.1 == b.1);
            let names: Vec<String> = raw.iter().map(|(p, s)| format!("{p}-{s:010}")).collect();
            let mut shuffled = names.clone();
            let mut rng = seed;
            for i in (1..shuffled.len()).rev() {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (rng >> 33) as usize % (i + 1));
            }
            let q = Queue::from_children(&shuffled);
            prop_assert_eq!(q.nodes.len(), names.len());
            for w in q.nodes.windows(2) {
                let (a, b) = (&w[0], &w[1]);
                prop_assert!(a.prefix < b.prefix || (a.prefix == b.prefix && a.sequence < b.sequence));
            }
            // Every foreground (A) node precedes every background (B) node.
            let last_a = q.nodes.iter().rposition(|n| n.prefix == "A");
            let first_b = q.nodes.iter().position(|n| n.prefix == "B");
            if let (Some(a), Some(b)) = (last_a, first_b) { prop_assert!(a < b); }
            // Predecessor of the head is none; of every other node, the node just before.
            for (i, n) in q.nodes.iter().enumerate() {
                let pred = q.predecessor(&n.name).map(|p| p.name.clone());
                prop_assert_eq!(pred, i.checked_sub(1).map(|j| q.nodes[j].name.clone()));
            }
        }
    }
}

//! The order in which outcomes were recorded, oldest first, for forgetting the oldest beyond
//! `KEEP_FINISHED`. An operation recorded again (a replay's new outcome) is listed again; it is
//! forgotten only once its last listing leaves, which the count of listings tells in constant
//! time (the table had to scan the whole list for it at every outcome).

use std::collections::{HashMap, VecDeque};

use uuid::Uuid;

#[derive(Debug, Default)]
pub(super) struct FinishedOrder {
    order: VecDeque<Uuid>,
    listed: HashMap<Uuid, u32>,
}

impl FinishedOrder {
    pub(super) fn push_back(&mut self, id: Uuid) {
        self.order.push_back(id);
        *self.listed.entry(id).or_default() += 1;
    }

    /// The oldest listing, and whether `id` is listed no more after it.
    pub(super) fn pop_front(&mut self) -> Option<(Uuid, bool)> {
        let id = self.order.pop_front()?;
        let last = match self.listed.get_mut(&id) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                self.listed.remove(&id);
                true
            }
        };
        Some((id, last))
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Uuid> {
        self.order.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::FinishedOrder;
    use uuid::Uuid;

    #[test]
    fn an_id_listed_twice_leaves_with_its_last_listing() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut order = FinishedOrder::default();
        order.push_back(a);
        order.push_back(b);
        order.push_back(a);
        assert_eq!(order.len(), 3);
        assert_eq!(order.pop_front(), Some((a, false)));
        assert_eq!(order.pop_front(), Some((b, true)));
        assert_eq!(order.pop_front(), Some((a, true)));
        assert_eq!(order.pop_front(), None);
    }
}

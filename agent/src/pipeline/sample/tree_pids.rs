//! The trainer tree's pids as this agent's `/proc` shows them, shared between samplers.
//!
//! The tree sampler (`process.rs`) publishes the pids it sampled on each tick; the GPU
//! sampler reads them to attribute per-process GPU figures to the tree. Every sampler runs
//! on the one sampler thread in the order `probe_samplers` registered them, so a reader sees
//! the previous tick's tree when it runs before the tree sampler; the lock is never contended.

use std::sync::{Arc, Mutex, PoisonError};

/// A cheap handle: clones share one list.
#[derive(Clone, Default, Debug)]
pub struct TreePids(Arc<Mutex<Arc<[u32]>>>);

impl TreePids {
    /// Replaces the list.
    pub fn publish(&self, pids: &[u32]) {
        let list: Arc<[u32]> = pids.into();
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = list;
    }

    /// The last list published (empty before the first).
    pub fn get(&self) -> Arc<[u32]> {
        Arc::clone(&self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_last_published_list() {
        let a = TreePids::default();
        let b = a.clone();
        assert!(b.get().is_empty());
        a.publish(&[3, 1, 2]);
        assert_eq!(&*b.get(), &[3, 1, 2]);
        a.publish(&[]);
        assert!(b.get().is_empty());
    }
}

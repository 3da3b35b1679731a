//! The domain definition the current spec converts to, as the Sync that accepted the spec
//! converted it: the next Sync compares its own conversion with this one (frozen fields,
//! interfaces) instead of converting the current spec a second time.
//!
//! What the comparison reads does not depend on which volumes are block devices (disks are
//! not compared), so the only input that moves under a kept conversion is the memory the guest
//! booted with (`ConvertOptions::guest_at_boot`: it changes with a boot); a conversion made for
//! other boot memory is not used.

use std::sync::Arc;

use crate::domain::DomainDef;

#[derive(Debug, Clone)]
pub(super) struct SyncedDomain {
    guest_at_boot: Option<u64>,
    domain: Arc<DomainDef>,
}

impl SyncedDomain {
    /// `domain`, converted for a guest that booted with `guest_at_boot`.
    pub(super) fn new(guest_at_boot: Option<u64>, domain: Arc<DomainDef>) -> SyncedDomain {
        SyncedDomain {
            guest_at_boot,
            domain,
        }
    }

    /// The kept conversion, if it was made for a guest that booted with `guest_at_boot`.
    pub(super) fn for_boot(&self, guest_at_boot: Option<u64>) -> Option<Arc<DomainDef>> {
        (self.guest_at_boot == guest_at_boot).then(|| Arc::clone(&self.domain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_is_used_only_for_the_boot_memory_it_was_made_for() {
        let domain = Arc::new(DomainDef::default());
        let kept = SyncedDomain::new(Some(1 << 30), Arc::clone(&domain));
        assert!(kept
            .for_boot(Some(1 << 30))
            .is_some_and(|d| Arc::ptr_eq(&d, &domain)));
        assert!(kept.for_boot(Some(2 << 30)).is_none());
        assert!(kept.for_boot(None).is_none());
    }
}

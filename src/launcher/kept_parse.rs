//! The last spec text a Sync parsed, and what it parsed to. A node daemon sends the whole spec
//! with every Sync, mostly the same one again; the parse (YAML or JSON into a document, the
//! document into the VMI, its validation) was the largest part of the launcher's own work in a
//! Sync that changes nothing: a fifth of its CPU samples, twice the host path checks (`perf`,
//! 2026-11-28, a YAML spec). The parse reads nothing but the text, so the same text parses
//! to the same VMI: it is kept and cloned. What depends on the host (its paths, its block
//! devices) is checked again by every Sync all the same. A switch of `tricks`
//! (`live-state-cache`) turns it off with the other state kept between Syncs. The lock is a
//! leaf.
//!
//! This is the launcher's own `Sync` (and its retries). KubeVirt's `SyncVirtualMachine` is not
//! kept: virt-handler sends the VMI of its informer, whose status and resource version move
//! between Syncs, so the same text seldom comes twice. A Sync of another text (a dry run, one
//! refused) takes the place of the kept one: the next Sync of the first text parses it again.

use std::sync::Mutex;

use crate::spec::{self, SpecErrors, Validated};

#[derive(Debug)]
pub(super) struct KeptParse {
    /// Off: every Sync parses its text.
    enabled: bool,
    last: Mutex<Option<(String, Validated)>>,
    /// Parses made, for the tests.
    #[cfg(test)]
    parses: std::sync::atomic::AtomicUsize,
}

impl KeptParse {
    pub(super) fn new(enabled: bool) -> KeptParse {
        KeptParse {
            enabled,
            last: Mutex::new(None),
            #[cfg(test)]
            parses: Default::default(),
        }
    }

    /// `text` parsed and validated (`spec::parse_bytes`): what the last parse of the same text
    /// gave, or a new parse, then kept. A text that does not parse is not kept.
    pub(super) fn parse(&self, text: &str) -> Result<Validated, SpecErrors> {
        if self.enabled {
            let last = self.last.lock().expect("kept parse lock");
            if let Some((kept_text, vmi)) = last.as_ref() {
                if kept_text == text {
                    return Ok(vmi.clone());
                }
            }
        }
        #[cfg(test)]
        self.parses
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let vmi = spec::parse_bytes(text.as_bytes())?;
        if self.enabled {
            *self.last.lock().expect("kept parse lock") = Some((text.to_owned(), vmi.clone()));
        }
        Ok(vmi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: kept\nspec:\n  domain:\n    memory:\n      guest: 128Mi\n    devices: {}\n";

    fn parses(kept: &KeptParse) -> usize {
        kept.parses.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn the_same_text_gives_what_a_parse_gives_and_another_text_is_parsed() {
        let kept = KeptParse::new(true);
        let first = kept.parse(SPEC).unwrap();
        assert_eq!(first, spec::parse_bytes(SPEC.as_bytes()).unwrap());
        assert_eq!(kept.parse(SPEC).unwrap(), first);
        assert_eq!(parses(&kept), 1, "the same text is not parsed again");
        let other = SPEC.replace("128Mi", "256Mi");
        let second = kept.parse(&other).unwrap();
        assert_ne!(
            second, first,
            "another text is parsed, not the kept one returned"
        );
        assert_eq!(second, spec::parse_bytes(other.as_bytes()).unwrap());
        assert_eq!(parses(&kept), 2);
    }

    #[test]
    fn switched_off_every_text_is_parsed() {
        let kept = KeptParse::new(false);
        assert_eq!(kept.parse(SPEC).unwrap(), kept.parse(SPEC).unwrap());
        assert_eq!(parses(&kept), 2);
    }

    #[test]
    fn a_text_that_does_not_parse_is_refused_every_time_and_keeps_nothing() {
        let kept = KeptParse::new(true);
        kept.parse(SPEC).unwrap();
        let bad = SPEC.replace("128Mi", "lots");
        let first = kept.parse(&bad).unwrap_err().to_string();
        assert!(first.contains("spec.domain.memory.guest"), "{first}");
        assert_eq!(kept.parse(&bad).unwrap_err().to_string(), first);
        // The good text kept before is still kept, and still what it gives.
        let parsed = parses(&kept);
        assert_eq!(
            kept.parse(SPEC).unwrap(),
            spec::parse_bytes(SPEC.as_bytes()).unwrap()
        );
        assert_eq!(parses(&kept), parsed, "a refused text replaces nothing");
    }
}

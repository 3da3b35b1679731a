//! The network-interface part of a Sync, KubeVirt's interface hotplug: an interface the spec
//! adds is plugged (with its published ports), one it drops or marks `state: absent` is
//! unplugged, and `state: up` / `down` sets the link; each with a result of its own. What the
//! domain has is read from libvirt's live XML, not remembered.

use super::coordinator::Launcher;
use super::error::{libvirt_message, LauncherError};
use super::types::{NicAction, NicChange, DETACH_TIMEOUT};
#[cfg(test)]
use crate::domain;
use crate::domain::{InterfaceDef, LiveInterface};

/// What changes `live` into `desired`: plugs and link changes in the spec's order, then
/// unplugs. Interfaces without vmlauncher's alias are not the spec's and are left alone.
pub(super) fn plan(live: &[LiveInterface], desired: &[InterfaceDef]) -> Vec<NicChange> {
    let change = |name: &str, action| NicChange {
        name: name.to_string(),
        action,
        error: None,
    };
    let mut changes = Vec::new();
    for want in desired {
        match live.iter().find(|l| l.name() == Some(want.name.as_str())) {
            None => changes.push(change(&want.name, NicAction::Attach)),
            Some(has) if has.link_down != want.link_down => changes.push(change(
                &want.name,
                if want.link_down {
                    NicAction::LinkDown
                } else {
                    NicAction::LinkUp
                },
            )),
            Some(_) => {}
        }
    }
    for has in live {
        if let Some(name) = has.name() {
            if !desired.iter().any(|d| d.name == name) {
                changes.push(change(name, NicAction::Detach));
            }
        }
    }
    changes
}

impl Launcher {
    /// Applies each planned change; one failing does not stop the next. An unplug waits for
    /// the guest to let the device go (DEVICE_REMOVED), up to `DETACH_TIMEOUT`. The caller
    /// shows the outcome (`refresh_live`).
    pub(super) async fn change_interfaces(
        &self,
        changes: Vec<NicChange>,
        live: &[LiveInterface],
        desired: &[InterfaceDef],
    ) -> Vec<NicChange> {
        let name = self.domain_name.as_str();
        let mut done = Vec::with_capacity(changes.len());
        for change in changes {
            let has = live.iter().find(|l| l.name() == Some(change.name.as_str()));
            let want = desired.iter().find(|d| d.name == change.name);
            let result = match (change.action, has, want) {
                (NicAction::Attach, _, Some(want)) => {
                    self.call(|hv| hv.attach_interface(name, &want.to_xml(), &want.alias()))
                }
                (NicAction::Detach, Some(has), _) => self.unplug(has).await,
                (NicAction::LinkUp | NicAction::LinkDown, Some(has), _) => {
                    let down = change.action == NicAction::LinkDown;
                    self.call(|hv| hv.update_device(name, &has.with_link(down)))
                }
                // `plan` pairs every action with what it needs.
                _ => Ok(()),
            };
            let error = result.err().map(|e| libvirt_message(&e));
            if let Some(error) = &error {
                tracing::warn!(interface = %change.name, action = change.action.as_str(), %error, "interface change failed");
            }
            done.push(NicChange { error, ..change });
        }
        done
    }

    async fn unplug(&self, has: &LiveInterface) -> Result<(), LauncherError> {
        let alias = has.alias.clone().unwrap_or_default();
        let removed = self.detaches.expect_removal(&alias);
        let name = self.domain_name.as_str();
        self.call(|hv| hv.detach(name, &has.xml, &alias))?;
        match tokio::time::timeout(DETACH_TIMEOUT, removed).await {
            Ok(_) => Ok(()),
            Err(_) => Err(LauncherError::InterfaceStuck {
                alias,
                waited: DETACH_TIMEOUT,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::InterfaceBackend;
    use crate::hotplug::frozen_interfaces_changed;

    fn def(name: &str, link_down: bool) -> InterfaceDef {
        InterfaceDef {
            name: name.into(),
            backend: InterfaceBackend::User,
            model: "virtio".into(),
            mac: None,
            boot_order: None,
            port_forwards: Vec::new(),
            link_down,
        }
    }

    fn live(name: &str, link_down: bool) -> LiveInterface {
        let link = if link_down {
            "<link state='down'/>"
        } else {
            ""
        };
        let xml = format!(
            "<domain><devices><interface type='user'><mac address='52:54:00:00:00:01'/>{link}<alias name='ua-{name}'/></interface></devices></domain>"
        );
        domain::live_interfaces(&xml).unwrap().remove(0)
    }

    #[test]
    fn plugs_relinks_then_unplugs_and_leaves_what_is_not_the_specs() {
        let mut foreign = live("x", false);
        foreign.alias = Some("net5".into());
        let changes = plan(
            &[
                live("a", false),
                live("b", false),
                live("gone", false),
                foreign,
            ],
            &[def("a", false), def("b", true), def("new", false)],
        );
        let got: Vec<_> = changes
            .iter()
            .map(|c| (c.name.as_str(), c.action))
            .collect();
        assert_eq!(
            got,
            vec![
                ("b", NicAction::LinkDown),
                ("new", NicAction::Attach),
                ("gone", NicAction::Detach),
            ]
        );
        assert_eq!(plan(&[live("b", true)], &[def("b", true)]), vec![]);
        assert_eq!(
            plan(&[live("b", true)], &[def("b", false)])[0].action,
            NicAction::LinkUp
        );
    }

    #[test]
    fn only_the_link_of_an_interface_that_stays_may_change() {
        let mut other_model = def("a", false);
        other_model.model = "e1000".into();
        assert!(!frozen_interfaces_changed(
            &[def("a", false)],
            &[def("a", true)]
        ));
        assert!(!frozen_interfaces_changed(
            &[def("a", false)],
            &[def("b", false)]
        ));
        assert!(frozen_interfaces_changed(
            &[def("a", false)],
            &[other_model]
        ));
    }

    #[test]
    fn a_link_change_keeps_the_element_libvirt_gave() {
        let up = live("a", false);
        let down = up.with_link(true);
        assert!(
            down.contains("<mac address='52:54:00:00:00:01'/>"),
            "{down}"
        );
        assert!(down.contains("<link state='down'/></interface>"), "{down}");
        let relinked = live("a", true).with_link(false);
        assert!(relinked.contains("<link state='up'/>"), "{relinked}");
        assert!(!relinked.contains("down"), "{relinked}");
    }
}

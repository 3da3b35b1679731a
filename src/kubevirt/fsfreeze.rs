//! `FreezeVirtualMachine` and `UnfreezeVirtualMachine`, as KubeVirt's launcher does them
//! (`virtwrap/storage/fsfreeze.go`): the guest agent is asked for its filesystems' state first
//! (no agent: the call fails with libvirt's reason, and nothing changes), a frozen guest is not
//! frozen again, a thawed one not thawed again, and a freeze arms a safety thaw after its
//! `unfreezeTimeoutSeconds` (a snapshot that never ends must not leave the guest frozen). Not
//! during a migration. The state is shown to virt-handler as the domain's `FSFreezeStatus`.

use std::time::Duration;

use super::front::{Front, FrontError};
use crate::launcher::Launcher;

/// The agent's filesystem states, KubeVirt's `api.FSFrozen` / `api.FSThawed`.
pub(crate) const FROZEN: &str = "frozen";
pub(crate) const THAWED: &str = "thawed";

/// libvirt's agent timeout for the freeze itself: a guest flushes its filesystems first
/// (virt-handler waits 60 s for the call).
const FREEZE_TIMEOUT_SECS: i32 = 50;
/// For the status query and a thaw.
const SHORT_TIMEOUT_SECS: i32 = 5;

/// The agent's answer to `guest-fsfreeze-status`: `frozen` or `thawed`.
async fn status(launcher: &Launcher) -> Result<String, FrontError> {
    let answer = launcher
        .agent_command(r#"{"execute":"guest-fsfreeze-status"}"#, SHORT_TIMEOUT_SECS)
        .await?;
    super::guest_agent::agent_return(&answer, crate::libvirt::MAX_AGENT_ANSWER)
        .and_then(|v| v.as_str().map(str::to_string))
        .ok_or_else(|| FrontError::AgentAnswer {
            command: "guest-fsfreeze-status",
            answer,
        })
}

impl Front {
    /// `FreezeVirtualMachine`.
    pub(crate) async fn freeze(
        self: &std::sync::Arc<Self>,
        unfreeze_timeout: Duration,
    ) -> Result<(), FrontError> {
        let _turn = self.safety_thaw.1.lock().await;
        let launcher = self.running()?.clone();
        let migrating = launcher
            .status()
            .migration
            .is_some_and(|m| !m.state.is_over());
        if migrating {
            return Err(FrontError::FreezeDuringMigration);
        }
        if status(&launcher).await? == FROZEN {
            return Ok(());
        }
        launcher
            .agent_command(
                r#"{"execute":"guest-fsfreeze-freeze"}"#,
                FREEZE_TIMEOUT_SECS,
            )
            .await?;
        self.update_meta(|m| m.domain.fs_freeze_status = Some(FROZEN.into()));
        self.safety_thaw.cancel();
        if !unfreeze_timeout.is_zero() {
            let front = self.clone();
            self.safety_thaw.arm(tokio::spawn(async move {
                tokio::time::sleep(unfreeze_timeout).await;
                tracing::warn!(
                    timeout = ?unfreeze_timeout,
                    "unfreeze was not called within the freeze's timeout: thawing the guest"
                );
                if let Err(e) = front.thaw(false).await {
                    tracing::warn!("the safety thaw failed: {e}");
                }
            }));
        }
        Ok(())
    }

    /// `UnfreezeVirtualMachine` (and the safety thaw, which must not cancel itself).
    pub(crate) async fn thaw(&self, cancel_safety: bool) -> Result<(), FrontError> {
        let _turn = self.safety_thaw.1.lock().await;
        if cancel_safety {
            self.safety_thaw.cancel();
        }
        let launcher = self.running()?.clone();
        // As KubeVirt's: a thawed guest is not thawed again (its thaw hooks would run twice);
        // a status that cannot be read does not stop the thaw.
        if status(&launcher).await.is_ok_and(|s| s == THAWED) {
            self.update_meta(|m| m.domain.fs_freeze_status = Some(THAWED.into()));
            return Ok(());
        }
        launcher
            .agent_command(r#"{"execute":"guest-fsfreeze-thaw"}"#, SHORT_TIMEOUT_SECS)
            .await?;
        self.update_meta(|m| m.domain.fs_freeze_status = Some(THAWED.into()));
        Ok(())
    }
}

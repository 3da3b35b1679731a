//! The cmd server: `kubevirt.cmd.v1.Cmd` and `kubevirt.cmd.info.CmdInfo` on the pod's socket, as
//! virt-handler calls them. Errors are answered as the Go launcher answers them,
//! `Response{success: false, message}` with an OK status; what is not built answers
//! `UNIMPLEMENTED`, which virt-handler's client recognises.
//!
//! State-changing work runs on a task of its own: a handler whose 20 s deadline runs out while a
//! first Sync still defines the domain does not cut it off. The answer waits for the work up to
//! [`ANSWER_WITHIN`], then says it goes on; virt-handler learns the outcome from the domain.

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::front::{Front, FrontError};
use super::guest_agent::{filesystems_json, guest_info_json, users_json, GUEST_INFO_COMMANDS};
use super::migration;
use super::proto::cmd::cmd_server::Cmd;
use super::proto::cmd::*;
use super::proto::cmd_info::cmd_info_server::CmdInfo;
use super::proto::cmd_info::{CmdInfoRequest, CmdInfoResponse};
use crate::launcher::ResourcePart;
use crate::lifecycle::Command;

/// Under virt-handler's 20 s deadline for state-changing calls.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

#[derive(Debug, Clone)]
pub(crate) struct CmdService {
    pub front: Arc<Front>,
}

fn ok() -> cmd::Response {
    cmd::Response {
        success: true,
        message: String::new(),
    }
}

fn failed(e: &FrontError) -> cmd::Response {
    cmd::Response {
        success: false,
        message: e.to_string(),
    }
}

/// A quick call's answer, its failure logged.
fn answer(what: &'static str, result: Result<(), FrontError>) -> cmd::Response {
    match result {
        Ok(()) => ok(),
        Err(e) => {
            tracing::warn!(call = what, "{e}");
            failed(&e)
        }
    }
}

/// The generated `Response` type, named apart from tonic's.
mod cmd {
    pub(crate) use super::super::proto::cmd::Response;
}

impl CmdService {
    /// Runs `work` on its own task; answers with its result, or success-so-far once
    /// [`ANSWER_WITHIN`] has passed (the work goes on).
    async fn detached<F>(
        &self,
        what: &'static str,
        work: F,
    ) -> Result<Response<cmd::Response>, Status>
    where
        F: std::future::Future<Output = Result<(), FrontError>> + Send + 'static,
    {
        // `work` boxed before it is wrapped: a wrapper around it unboxed is built on this
        // frame, tens of KiB (`spawn::spawn_boxed` says why that matters).
        let work = Box::pin(work);
        let mut task = tokio::spawn(async move {
            let result = work.await;
            if let Err(e) = &result {
                tracing::warn!(call = what, "{e}");
            }
            result
        });
        match tokio::time::timeout(ANSWER_WITHIN, &mut task).await {
            Ok(Ok(Ok(()))) => Ok(Response::new(ok())),
            Ok(Ok(Err(e))) => Ok(Response::new(failed(&e))),
            Ok(Err(join)) => Err(Status::internal(format!("{what} panicked: {join}"))),
            Err(_) => {
                tracing::info!(
                    call = what,
                    "still working after {ANSWER_WITHIN:?}; answering, the work goes on"
                );
                Ok(Response::new(ok()))
            }
        }
    }

    fn vmi_json(request: &VmiRequest) -> Vec<u8> {
        request
            .vmi
            .as_ref()
            .map(|v| v.vmi_json.clone())
            .unwrap_or_default()
    }

    async fn command(
        &self,
        what: &'static str,
        command: Command,
    ) -> Result<Response<cmd::Response>, Status> {
        let front = self.front.clone();
        self.detached(what, async move { front.command(command).await })
            .await
    }
}

/// What virt-handler's client reads as "not implemented" (it checks the status code).
fn not_built(call: &str) -> Status {
    Status::unimplemented(format!("{call} is not implemented by vmlauncher"))
}

#[tonic::async_trait]
impl Cmd for CmdService {
    async fn sync_virtual_machine(
        &self,
        request: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let json = Self::vmi_json(request.get_ref());
        let front = self.front.clone();
        self.detached("SyncVirtualMachine", async move { front.sync(&json).await })
            .await
    }

    async fn pause_virtual_machine(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.command("PauseVirtualMachine", Command::Pause).await
    }

    async fn unpause_virtual_machine(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.command("UnpauseVirtualMachine", Command::Unpause)
            .await
    }

    async fn reset_virtual_machine(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.command("ResetVirtualMachine", Command::Reset).await
    }

    async fn soft_reboot_virtual_machine(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.command("SoftRebootVirtualMachine", Command::SoftReboot)
            .await
    }

    async fn shutdown_virtual_machine(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let front = self.front.clone();
        self.detached(
            "ShutdownVirtualMachine",
            async move { front.shutdown().await },
        )
        .await
    }

    async fn kill_virtual_machine(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.command("KillVirtualMachine", Command::Kill).await
    }

    async fn delete_virtual_machine(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let front = self.front.clone();
        self.detached("DeleteVirtualMachine", async move { front.delete().await })
            .await
    }

    async fn get_domain(
        &self,
        _: Request<EmptyRequest>,
    ) -> Result<Response<DomainResponse>, Status> {
        let (response, domain) = match self.front.domain().await {
            Ok(Some(d)) => (ok(), d.to_string()),
            Ok(None) => (ok(), String::new()),
            Err(e) => (failed(&e), String::new()),
        };
        Ok(Response::new(DomainResponse {
            response: Some(response),
            domain,
        }))
    }

    /// No domain is success with no stats: virt-handler's client reads `""` as "does not
    /// exist".
    async fn get_domain_stats(
        &self,
        _: Request<EmptyRequest>,
    ) -> Result<Response<DomainStatsResponse>, Status> {
        let (response, domain_stats) = match self.front.domain_stats().await {
            Ok(Some(stats)) => (ok(), stats.to_string()),
            Ok(None) => (ok(), String::new()),
            Err(e) => (failed(&e), String::new()),
        };
        Ok(Response::new(DomainStatsResponse {
            response: Some(response),
            domain_stats,
        }))
    }

    /// Without a connected agent, `{}`: what virt-handler reads as "no guest agent".
    async fn get_guest_info(
        &self,
        _: Request<EmptyRequest>,
    ) -> Result<Response<GuestInfoResponse>, Status> {
        let answers = self.front.guest_agent(GUEST_INFO_COMMANDS).await;
        Ok(Response::new(GuestInfoResponse {
            response: Some(ok()),
            guest_info_response: guest_info_json(&answers).to_string(),
        }))
    }

    async fn get_users(
        &self,
        _: Request<EmptyRequest>,
    ) -> Result<Response<GuestUserListResponse>, Status> {
        let answers = self.front.guest_agent(&["guest-get-users"]).await;
        let users = users_json(answers.get("guest-get-users"), usize::MAX);
        Ok(Response::new(GuestUserListResponse {
            response: Some(ok()),
            guest_user_list_response: users.to_string(),
        }))
    }

    async fn get_filesystems(
        &self,
        _: Request<EmptyRequest>,
    ) -> Result<Response<GuestFilesystemsResponse>, Status> {
        let answers = self.front.guest_agent(&["guest-get-fsinfo"]).await;
        let filesystems = filesystems_json(answers.get("guest-get-fsinfo"), usize::MAX);
        Ok(Response::new(GuestFilesystemsResponse {
            response: Some(ok()),
            guest_filesystems_response: filesystems.to_string(),
        }))
    }

    async fn ping(&self, _: Request<EmptyRequest>) -> Result<Response<cmd::Response>, Status> {
        Ok(Response::new(ok()))
    }

    async fn get_qemu_version(
        &self,
        _: Request<EmptyRequest>,
    ) -> Result<Response<QemuVersionResponse>, Status> {
        let front = self.front.clone();
        let version = match front.qemu_version.get() {
            Some(known) => Ok(known.clone()),
            None => tokio::task::spawn_blocking(move || {
                let version = match front.launcher() {
                    Some(l) => l.hypervisor_version().map_err(|e| crate::error_chain(&e)),
                    None => crate::libvirt::hypervisor_version(&front.connector().uri())
                        .map_err(|e| crate::error_chain(&e)),
                }?;
                // QEMU's version does not change under a launcher: asked once.
                Ok(front.qemu_version.get_or_init(|| version).clone())
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?,
        };
        Ok(Response::new(match version {
            Ok(version) => QemuVersionResponse {
                response: Some(ok()),
                version,
            },
            Err(message) => QemuVersionResponse {
                response: Some(cmd::Response {
                    success: false,
                    message,
                }),
                version: String::new(),
            },
        }))
    }

    async fn freeze_virtual_machine(
        &self,
        request: Request<FreezeRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        // Answered only once the guest is frozen (or the freeze failed), as KubeVirt's
        // FreezeVMI: a snapshot taken on an early "success" would copy a guest still writing.
        // Bounded by the agent's timeout, under virt-handler's 60 s for this call.
        let seconds = request.get_ref().unfreeze_timeout_seconds.max(0) as u64;
        let result = self
            .front
            .freeze(std::time::Duration::from_secs(seconds))
            .await;
        Ok(Response::new(answer("FreezeVirtualMachine", result)))
    }

    async fn unfreeze_virtual_machine(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let result = self.front.thaw(true).await;
        Ok(Response::new(answer("UnfreezeVirtualMachine", result)))
    }

    /// Answers at once, as KubeVirt's launcher does: the migration runs on, its outcome is in
    /// the domain's migration metadata.
    async fn migrate_virtual_machine(
        &self,
        request: Request<MigrationRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let result = migration::migrate(self.front.clone(), request.into_inner()).await;
        Ok(Response::new(answer("MigrateVirtualMachine", result)))
    }

    async fn sync_migration_target(
        &self,
        request: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let json = Self::vmi_json(request.get_ref());
        let front = self.front.clone();
        self.detached("SyncMigrationTarget", migration::sync_target(front, json))
            .await
    }

    async fn cancel_virtual_machine_migration(
        &self,
        request: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let json = Self::vmi_json(request.get_ref());
        let result = migration::cancel(&self.front, &json);
        Ok(Response::new(answer(
            "CancelVirtualMachineMigration",
            result,
        )))
    }

    /// KubeVirt's launcher lets a failed target pod's virt-launcher exit early. A vmlauncher
    /// target whose guest never came ends by itself (phase Failed, MigrationFailed): nothing
    /// to signal.
    async fn signal_target_pod_cleanup(
        &self,
        request: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let json = Self::vmi_json(request.get_ref());
        let result = self.front.handler_vmi(&json).map(drop);
        Ok(Response::new(answer("SignalTargetPodCleanup", result)))
    }

    async fn finalize_virtual_machine_migration(
        &self,
        request: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let result = migration::finalize(&self.front, request.get_ref());
        Ok(Response::new(answer(
            "FinalizeVirtualMachineMigration",
            result,
        )))
    }

    async fn hotplug_host_devices(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        Err(not_built("hotplug_host_devices"))
    }

    async fn exec(&self, _: Request<ExecRequest>) -> Result<Response<ExecResponse>, Status> {
        Err(not_built("exec"))
    }

    async fn guest_ping(
        &self,
        _: Request<GuestPingRequest>,
    ) -> Result<Response<GuestPingResponse>, Status> {
        Err(not_built("guest_ping"))
    }

    async fn virtual_machine_memory_dump(
        &self,
        _: Request<MemoryDumpRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        Err(not_built("virtual_machine_memory_dump"))
    }

    async fn sync_virtual_machine_cp_us(
        &self,
        request: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let json = Self::vmi_json(request.get_ref());
        let front = self.front.clone();
        self.detached("SyncVirtualMachineCPUs", async move {
            front.sync_resource(&json, ResourcePart::Cpu).await
        })
        .await
    }

    async fn sync_virtual_machine_memory(
        &self,
        request: Request<VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let json = Self::vmi_json(request.get_ref());
        let front = self.front.clone();
        self.detached("SyncVirtualMachineMemory", async move {
            front.sync_resource(&json, ResourcePart::Memory).await
        })
        .await
    }

    async fn get_sev_info(
        &self,
        _: Request<EmptyRequest>,
    ) -> Result<Response<SevInfoResponse>, Status> {
        Err(not_built("get_sev_info"))
    }

    async fn get_launch_measurement(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<LaunchMeasurementResponse>, Status> {
        Err(not_built("get_launch_measurement"))
    }

    async fn inject_launch_secret(
        &self,
        _: Request<InjectLaunchSecretRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        Err(not_built("inject_launch_secret"))
    }

    async fn get_domain_dirty_rate_stats(
        &self,
        _: Request<EmptyRequest>,
    ) -> Result<Response<DirtyRateStatsResponse>, Status> {
        Err(not_built("get_domain_dirty_rate_stats"))
    }

    async fn get_screenshot(
        &self,
        _: Request<VmiRequest>,
    ) -> Result<Response<ScreenshotResponse>, Status> {
        Err(not_built("get_screenshot"))
    }

    async fn backup_virtual_machine(
        &self,
        _: Request<BackupRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        Err(not_built("backup_virtual_machine"))
    }

    async fn redefine_checkpoint(
        &self,
        _: Request<RedefineCheckpointRequest>,
    ) -> Result<Response<RedefineCheckpointResponse>, Status> {
        Err(not_built("redefine_checkpoint"))
    }

    async fn get_vm_stats(
        &self,
        _: Request<VmStatsRequest>,
    ) -> Result<Response<VmStatsResponse>, Status> {
        Err(not_built("get_vm_stats"))
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct InfoService;

#[tonic::async_trait]
impl CmdInfo for InfoService {
    async fn info(&self, _: Request<CmdInfoRequest>) -> Result<Response<CmdInfoResponse>, Status> {
        Ok(Response::new(CmdInfoResponse {
            supported_cmd_versions: vec![1],
        }))
    }
}

//! `GetDomainStats` and the guest agent calls of `vmlauncher virt-launcher`, on a real TCG guest
//! driven over KubeVirt's cmd protocol by a plain tonic client: before the first Sync there is no
//! domain (no stats, an empty guest info); after it the stats name the domain and carry its cpu,
//! balloon, vCPU and block sections. The test guest's qemu-ga connects: virt-handler is told
//! (the notified domain's agent channel `connected`, what sets the VMI's `AgentConnected`), and
//! `GetGuestInfo` carries the guest's hostname and OS; its freeze fails cleanly (the initramfs
//! has nothing to freeze) and leaves it thawed.

use crate::common;

use std::time::Duration;

use common::kubevirt::{cmd_client, guest_vmi_json, PodDirs, VirtLauncher};
use common::kubevirt_notify::NotifyRecorder;
use vmlauncher::kubevirt::proto::cmd::cmd_client::CmdClient;
use vmlauncher::kubevirt::proto::cmd::{EmptyRequest, FreezeRequest, Vmi, VmiRequest};

type Client = CmdClient<tonic::transport::Channel>;

async fn stats(client: &mut Client) -> String {
    let r = client
        .get_domain_stats(EmptyRequest {})
        .await
        .expect("GetDomainStats")
        .into_inner();
    assert!(r.response.as_ref().is_some_and(|r| r.success), "{r:?}");
    r.domain_stats
}

async fn guest_info(client: &mut Client) -> (String, String, String) {
    let info = client.get_guest_info(EmptyRequest {}).await.unwrap();
    let users = client.get_users(EmptyRequest {}).await.unwrap();
    let fs = client.get_filesystems(EmptyRequest {}).await.unwrap();
    let (info, users, fs) = (info.into_inner(), users.into_inner(), fs.into_inner());
    for ok in [&info.response, &users.response, &fs.response] {
        assert!(ok.as_ref().is_some_and(|r| r.success));
    }
    (
        info.guest_info_response,
        users.guest_user_list_response,
        fs.guest_filesystems_response,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domain_stats_and_guest_info_over_the_cmd_socket() {
    let dirs = PodDirs::new();
    let (name, namespace, uid) = ("statsvmi", "kvtest", "0b7e3a52-55a1-4c3e-9a43-2f7c1d9e6a10");
    let mut notify = NotifyRecorder::serve(&dirs.share());
    let mut launcher = VirtLauncher::start(&dirs, &dirs.flags(name, namespace, uid));
    let socket = tokio::task::block_in_place(|| launcher.wait_serving(&dirs));
    let mut client = cmd_client(&socket).await;

    // No domain yet: success with no stats (virt-handler's "does not exist"), no guest info.
    assert_eq!(stats(&mut client).await, "");
    assert_eq!(
        guest_info(&mut client).await,
        ("{}".into(), "[]".into(), "[]".into())
    );

    // The guest with a disk, so that the block stats have one.
    let mut vmi = guest_vmi_json(name, namespace, uid);
    vmi["spec"]["domain"]["devices"]["disks"] =
        serde_json::json!([{"name": "scratch", "disk": {"bus": "virtio"}}]);
    vmi["spec"]["volumes"] =
        serde_json::json!([{"name": "scratch", "emptyDisk": {"capacity": "16Mi"}}]);
    let synced = client
        .sync_virtual_machine(VmiRequest {
            vmi: Some(Vmi {
                vmi_json: vmi.to_string().into_bytes(),
            }),
            options: None,
        })
        .await
        .expect("SyncVirtualMachine")
        .into_inner();
    assert!(
        synced.success,
        "{synced:?}; stderr:\n{}",
        launcher.stderr_text()
    );

    // The domain's own name and UUID, as GetDomain reports them.
    let domain = client
        .get_domain(EmptyRequest {})
        .await
        .unwrap()
        .into_inner()
        .domain;
    let domain: serde_json::Value = serde_json::from_str(&domain).expect("domain JSON");
    let domain_name = domain["Spec"]["Name"].as_str().unwrap().to_string();
    let domain_uuid = domain["Spec"]["UUID"].as_str().unwrap().to_string();
    assert_eq!(domain_name, format!("{namespace}_{name}"));

    // Once the guest has booted it has run (CPU time) and its disk is open: every group the
    // assertions read is there in one answer.
    let mut console = vmlauncher::console::ConsoleLog::from_start(&dirs.console_log(uid))
        .expect("the console log");
    tokio::task::block_in_place(|| common::wait_booted(&mut console));
    let stats: serde_json::Value =
        serde_json::from_str(&stats(&mut client).await).expect("stats JSON");
    assert_eq!(stats["Name"], domain_name.as_str(), "{stats:#}");
    assert_eq!(stats["UUID"], domain_uuid.as_str(), "{stats:#}");
    assert_eq!(stats["Cpu"]["TimeSet"], true, "{stats:#}");
    assert!(stats["Cpu"]["Time"].as_u64().unwrap() > 0, "{stats:#}");
    assert_eq!(stats["Memory"]["ActualBalloonSet"], true, "{stats:#}");
    assert_eq!(stats["Memory"]["TotalSet"], true, "{stats:#}");
    // 256Mi of guest memory, in KiB.
    assert_eq!(stats["Memory"]["ActualBalloon"], 262_144, "{stats:#}");
    let vcpus = stats["Vcpu"].as_array().unwrap();
    assert!(!vcpus.is_empty(), "{stats:#}");
    assert_eq!(vcpus[0]["StateSet"], true, "{stats:#}");
    let blocks = stats["Block"].as_array().unwrap();
    let scratch = blocks
        .iter()
        .find(|b| b["Alias"] == "scratch")
        .unwrap_or_else(|| panic!("no block stats aliased scratch: {stats:#}"));
    assert_eq!(scratch["NameSet"], true, "{stats:#}");
    assert_eq!(scratch["CapacitySet"], true, "{stats:#}");
    assert_eq!(scratch["Capacity"], 16 << 20, "{stats:#}");
    assert_eq!(scratch["RdReqsSet"], true, "{stats:#}");

    agent_answers(&mut client, &mut notify).await;

    // SIGTERM: KubeVirt's graceful shutdown, which ends the launcher with 0.
    let mut launcher = launcher;
    launcher.signal(nix::sys::signal::Signal::SIGTERM);
    let status = launcher.wait_exit(Duration::from_secs(90));
    assert_eq!(status.code(), Some(0), "{}", launcher.stderr_text());
}

/// Whether the domain virt-handler decodes has the guest agent's channel `connected`: what its
/// `guestAgentConnected` reads to set the VMI's `AgentConnected`.
fn agent_connected(domain: &serde_json::Value) -> bool {
    domain["Spec"]["Devices"]["Channels"]
        .as_array()
        .is_some_and(|channels| {
            channels.iter().any(|c| {
                c["Target"]["Name"] == "org.qemu.guest_agent.0"
                    && c["Target"]["State"] == "connected"
            })
        })
}

/// The test guest's qemu-ga, through what virt-handler sees and asks.
async fn agent_answers(client: &mut Client, notify: &mut NotifyRecorder) {
    // qemu-ga starts in the background after the boot line; libvirt sees the port open and the
    // launcher notifies the domain again.
    tokio::task::block_in_place(|| {
        notify.domain("agent connected", Duration::from_secs(120), |_, d| {
            agent_connected(d)
        })
    });
    let (info, users, filesystems) = guest_info(client).await;
    let info: serde_json::Value = serde_json::from_str(&info).expect("guest info JSON");
    assert_eq!(info["hostname"], "testguest", "{info:#}");
    assert_eq!(info["os"]["name"], "vmlauncher test guest", "{info:#}");
    assert_eq!(info["os"]["id"], "vmltest", "{info:#}");
    assert!(
        info["guestAgentVersion"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{info:#}"
    );
    // No utmp in the initramfs; its rootfs is no block device's filesystem.
    assert_eq!((users.as_str(), filesystems.as_str()), ("[]", "[]"));
    freeze_round_trip(client, notify).await;
}

/// Waits for virt-handler to be told the domain's `Status.FSFreezeStatus.Status` is `wanted`.
fn notified_freeze(notify: &mut NotifyRecorder, wanted: &str) {
    tokio::task::block_in_place(|| {
        notify.domain(wanted, Duration::from_secs(30), |_, d| {
            d["Status"]["FSFreezeStatus"]["Status"] == wanted
        })
    });
}

/// Freeze then unfreeze. The initramfs has nothing to freeze, and qemu-ga says so by freezing
/// none: the freeze succeeds, the agent counts the guest frozen (it refuses other commands
/// until the thaw), and the thaw ends it, as with a real filesystem.
async fn freeze_round_trip(client: &mut Client, notify: &mut NotifyRecorder) {
    let vmi = || {
        Some(Vmi {
            vmi_json: b"{}".to_vec(),
        })
    };
    let frozen = client
        .freeze_virtual_machine(FreezeRequest {
            vmi: vmi(),
            unfreeze_timeout_seconds: 60,
        })
        .await
        .expect("FreezeVirtualMachine")
        .into_inner();
    assert!(frozen.success, "{frozen:?}");
    notified_freeze(notify, "frozen");
    let thawed = client
        .unfreeze_virtual_machine(VmiRequest {
            vmi: vmi(),
            options: None,
        })
        .await
        .expect("UnfreezeVirtualMachine")
        .into_inner();
    assert!(thawed.success, "{thawed:?}");
    notified_freeze(notify, "thawed");
    // The agent answers everything again: it is thawed.
    let (info, _, _) = guest_info(client).await;
    assert!(info.contains("testguest"), "{info}");
}

//! `run --connect qemu:///system`: the launcher drives an existing libvirt (here the machine's own
//! libvirtd, which `scripts/setup.sh` starts) instead of a private one: boot, hot-plug a disk the
//! guest sees, SIGTERM, and nothing of ours left in that libvirt.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

use common::{guest_spec, Launched, BOOT_DEADLINE, GUEST_DEADLINE};
use vmlauncher::api::{self, proto};

const SYSTEM: &str = "qemu:///system";

fn system_has_domain(name: &str) -> bool {
    let conn = virt::connect::Connect::open(Some(SYSTEM))
        .expect("the system libvirtd (scripts/setup.sh starts it)");
    conn.lookup_domain_by_name(name).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_a_vm_on_the_system_libvirtd() {
    let name = "on-system-libvirt";
    let domain = format!("default_{name}");
    assert!(
        !system_has_domain(&domain),
        "a leftover {domain} in the system libvirt"
    );
    let mut pending = Launched::start_owned(|dir| {
        // QEMU runs as libvirt-qemu there: it must reach the console log and the disk.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    });
    let mut vm = pending.run(&guest_spec(name, "", &[]), &["--connect", SYSTEM]);
    let line = vm.wait_stdout("vmlauncher: libvirt", GUEST_DEADLINE);
    assert!(line.ends_with(SYSTEM), "{line}");
    vm.wait_stdout("phase Running", BOOT_DEADLINE);
    let mut console = vm.console();
    console
        .wait_for(
            "the guest's boot line",
            Instant::now() + BOOT_DEADLINE,
            |l| l == "VMLTEST-BOOTED",
        )
        .unwrap();
    assert!(system_has_domain(&domain));

    let disk = vm.dir().join("sys.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let reply = api::connect(&vm.socket())
        .await
        .unwrap()
        .sync(proto::SyncRequest {
            spec: guest_spec(name, "", &[("sys", "On-System-1", &disk)]),
            dry_run: false,
        })
        .await
        .expect("Sync")
        .into_inner();
    assert_eq!(
        reply.volumes[0].phase,
        proto::volume_status::Phase::Ready as i32,
        "{reply:?}"
    );
    console
        .wait_for(
            "the disk in the guest",
            Instant::now() + GUEST_DEADLINE,
            |l| l.starts_with("VMLTEST-DISKS") && l.contains(":On-System-1:8192"),
        )
        .unwrap();

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
    assert!(
        !system_has_domain(&domain),
        "the launcher left its domain in the system libvirt"
    );
    assert!(
        !vm.dir().join("libvirt").exists(),
        "no private libvirtd with --connect"
    );
}

//! Disk images in places a tenant or an image author writes (a claim's `disk.img`, a container
//! disk's `disk_N.img`) are opened only as themselves: one that is a symbolic link, which could
//! hand the guest any file of the launcher's (QEMU runs as root), is refused at start, naming the
//! volume, with exit 4, before QEMU opens anything; on hot-plug the volume is Failed. A hostDisk
//! that leads into the runtime dir through a link is a bad Sync. The link's target is untouched.
//! Against the real binary and a real private libvirtd (and, for hot-plug, a TCG guest).

use crate::common;

use common::{guest_spec, live_disk_source, with_claims, ConsoleWait, Launched, GUEST_DEADLINE};
use vmlauncher::api::{self, proto};

const TARGET_BYTES: &[u8] = b"#!/bin/sh\n# a file of the launcher's\n";

/// `text` (a VMI with `disks: []` and `volumes: []`) with volume `data` from `source`.
fn with_volume(text: String, source: &str) -> String {
    text.replace(
        "      disks: []\n",
        "      disks:\n      - {name: data, disk: {bus: scsi}, serial: Data-1}\n",
    )
    .replace(
        "  volumes: []\n",
        &format!("  volumes:\n  - {{name: data, {source}}}\n"),
    )
}

/// Starts a launcher whose runtime dir has `link` (relative to it) pointing at a file outside,
/// and expects it to refuse volume `data` with exit 4, leaving the file as it was.
fn refused_at_start(name: &str, link: &str, source: &str) {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("launcher-file");
    std::fs::write(&target, TARGET_BYTES).unwrap();
    let mut vm = Launched::start_owned(|dir| {
        let link = dir.join(link);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
    })
    .run(&with_volume(guest_spec(name, "", &[]), source), &[]);
    let code = vm.wait_exit(GUEST_DEADLINE).code();
    let stderr = vm.stderr_text();
    assert_eq!(code, Some(4), "{stderr}");
    assert!(stderr.contains("volume \"data\""), "{stderr}");
    assert!(stderr.contains("is a symbolic link"), "{stderr}");
    assert_eq!(std::fs::read(&target).unwrap(), TARGET_BYTES);
}

#[test]
fn a_claim_whose_disk_img_is_a_symlink_is_refused_at_start() {
    refused_at_start(
        "pvc-link",
        "vmi-disks/data/disk.img",
        "persistentVolumeClaim: {claimName: data}",
    );
}

#[test]
fn a_container_disk_that_is_a_symlink_is_refused_at_start() {
    refused_at_start(
        "cd-link",
        "container-disks/disk_0.img",
        "containerDisk: {image: example/disk}",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hotplug_image_that_is_a_link_fails_and_a_host_disk_into_the_runtime_dir_is_refused() {
    let name = "hotplug-link";
    let mut vm = Launched::start(&guest_spec(name, "", &[]), &[]);
    vm.boot();
    let target = vm.scratch().join("launcher-file");
    std::fs::write(&target, TARGET_BYTES).unwrap();
    std::os::unix::fs::symlink(&target, vm.dir().join("hotplug/data.img")).unwrap();
    let mut client = api::connect(&vm.socket()).await.expect("gRPC socket");

    let spec = with_claims(guest_spec(name, "", &[]), &[("data", "Data-1")]);
    let reply = client
        .sync(proto::SyncRequest {
            spec,
            ..Default::default()
        })
        .await
        .expect("a Sync whose one volume fails")
        .into_inner();
    let data = reply.volumes.iter().find(|v| v.name == "data").unwrap();
    assert_eq!(
        data.phase,
        proto::volume_status::Phase::Failed as i32,
        "{data:?}"
    );
    assert_eq!(data.reason, "UnsafeImage", "{data:?}");
    assert!(data.message.contains("is a symbolic link"), "{data:?}");

    // Through a link in the test's own dir, the launcher's saved Sync.
    std::os::unix::fs::symlink(vm.dir(), vm.scratch().join("state")).unwrap();
    let via = vm.scratch().join("state/last-sync.1.json");
    let err = client
        .sync(proto::SyncRequest {
            spec: guest_spec(name, "", &[("d", "Saved-1", &via)]),
            ..Default::default()
        })
        .await
        .expect_err("a hostDisk into the runtime dir");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("spec.volumes[0].hostDisk.path: ")
            && err.message().contains("the launcher's own state"),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&target).unwrap(), TARGET_BYTES);

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

/// QEMU's command line, its arguments joined by spaces.
fn command_line(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Owner and permission bits of `path`.
fn owner_and_mode(path: &std::path::Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap();
    (meta.uid(), meta.mode() & 0o7777)
}

/// `(st_dev, st_ino)` of what `path` leads to (a `/proc/<pid>/fd/N` link: the open file).
fn inode(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The inodes QEMU holds open.
fn qemu_inodes(pid: i32) -> Vec<(u64, u64)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| inode(&e.ok()?.path()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_images_reach_qemu_as_descriptors_and_hotplugged_files_as_pinned() {
    use std::os::unix::fs::PermissionsExt;
    let name = "claim-fd";
    let make_image = |path: &std::path::Path| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        common::sparse_file(path, 4);
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    // The guest writes "vmltest <boot id>" at the start of the hot-plugged disk when it
    // appears, and reads it back on every change of its disks.
    let kernel_args = "vmltest.write=Late-1";
    let mut vm = Launched::start_owned(|dir| make_image(&dir.join("vmi-disks/data/disk.img"))).run(
        &with_volume(
            guest_spec(name, kernel_args, &[]),
            "persistentVolumeClaim: {claimName: data}",
        ),
        &[],
    );
    let mut console = vm.boot();
    let claim = vm.dir().join("vmi-disks/data/disk.img");
    // A hot-plugged file, from the hotplug dir a node daemon fills.
    let hotplugged = vm.dir().join("hotplug/late.img");
    make_image(&hotplugged);
    let checked = inode(&hotplugged).unwrap();
    let mut client = api::connect(&vm.socket()).await.expect("gRPC socket");
    let spec_with = |extra: &[&str]| {
        let mut disks = String::from("      - {name: data, disk: {bus: scsi}, serial: Data-1}\n");
        let mut volumes =
            String::from("  - {name: data, persistentVolumeClaim: {claimName: data}}\n");
        for (volume, serial) in extra.iter().map(|v| (v, format!("{}-1", capitalised(v)))) {
            disks +=
                &format!("      - {{name: {volume}, disk: {{bus: scsi}}, serial: {serial}}}\n");
            volumes += &format!(
                "  - {{name: {volume}, persistentVolumeClaim: {{claimName: {volume}, hotpluggable: true}}}}\n"
            );
        }
        with_volume(
            guest_spec(name, kernel_args, &[]),
            "persistentVolumeClaim: {claimName: data}",
        )
        .replace(
            "      - {name: data, disk: {bus: scsi}, serial: Data-1}\n",
            &disks,
        )
        .replace(
            "  - {name: data, persistentVolumeClaim: {claimName: data}}\n",
            &volumes,
        )
    };
    let reply = client
        .sync(proto::SyncRequest {
            spec: spec_with(&["late"]),
            ..Default::default()
        })
        .await
        .expect("a Sync that hot-plugs a file")
        .into_inner();
    let late = reply.volumes.iter().find(|v| v.name == "late").unwrap();
    assert_eq!(
        late.phase,
        proto::volume_status::Phase::Ready as i32,
        "{late:?}"
    );
    console.line("the guest sees both disks", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-SERIALS") && l.contains("serial=Data-1") && l.contains("serial=Late-1")
    });
    // The guest writes a new disk and reports its disks in whichever order comes: its write is
    // looked for from the log's start (Late-1 is plugged once until here).
    let mut writes = vm.console();
    let wrote = writes.line(
        "the guest wrote the hot-plugged disk",
        GUEST_DEADLINE,
        |l| l.contains("VMLTEST-WROTE Late-1 "),
    );
    let written = format!("vmltest {}", wrote.split_whitespace().last().unwrap());
    let read = writes.line("the guest reads it back", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-READ Late-1 ")
    });
    assert!(read.contains(&written), "{read}");

    // QEMU (not root) never opened the claim's path: it was given a descriptor, and the file
    // stays root's. The hot-plugged file (libvirt 9.0 cannot pass one by descriptor) was given
    // to QEMU's user by the launcher, through the descriptor it checked, not by libvirt's
    // chown of a path.
    let qemu = vm.qemu_pid(name);
    let cmdline = command_line(qemu);
    assert!(cmdline.contains("/dev/fdset/"), "{cmdline}");
    assert!(!cmdline.contains(claim.to_str().unwrap()), "{cmdline}");
    assert_eq!(owner_and_mode(&claim), (0, 0o600));
    // This VM's QEMU id, no shared account.
    let qemu_uid = common::qemu_id_of(vm.dir());
    assert_eq!(owner_and_mode(&hotplugged), (qemu_uid, 0o600));
    let live = common::live_xml(&vm.libvirt_uri(), &format!("default_{name}"));
    assert!(
        live.contains("relabel=\"no\"") || live.contains("relabel='no'"),
        "{live}"
    );
    // QEMU was given the launcher's pin of the inode it checked, in a directory only the
    // launcher writes, never the hotplug dir's path, which the node daemon (and a tenant) write.
    let pin = vm.dir().join("pins/late.img");
    assert_eq!(
        live_disk_source(&live, "late").as_deref(),
        pin.to_str(),
        "{live}"
    );
    assert!(
        qemu_inodes(qemu).contains(&checked),
        "QEMU holds the checked inode"
    );

    // The hotplug dir's file becomes a link to another file: what QEMU has, and the pin, stay
    // the checked inode, and the guest still reads what it wrote there.
    let decoy = vm.dir().join("decoy.img");
    std::fs::write(&decoy, b"decoy\n").unwrap();
    let moved = vm.dir().join("late.orig");
    std::fs::rename(&hotplugged, &moved).unwrap();
    std::os::unix::fs::symlink(&decoy, &hotplugged).unwrap();
    // Another hot-plugged file: the guest's disks change, and it reads `late` back.
    make_image(&vm.dir().join("hotplug/later.img"));
    let reply = client
        .sync(proto::SyncRequest {
            spec: spec_with(&["late", "later"]),
            ..Default::default()
        })
        .await
        .expect("a Sync that hot-plugs a second file")
        .into_inner();
    assert!(
        reply
            .volumes
            .iter()
            .all(|v| v.phase == proto::volume_status::Phase::Ready as i32),
        "{:?}",
        reply.volumes
    );
    console.line("the guest sees the second file", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-SERIALS") && l.contains("serial=Later-1")
    });
    let read = console.line(
        "the guest reads the pinned disk again",
        GUEST_DEADLINE,
        |l| l.contains("VMLTEST-READ Late-1 "),
    );
    assert!(read.contains(&written), "{read}");
    let qemu_has = qemu_inodes(qemu);
    assert!(qemu_has.contains(&checked));
    assert!(!qemu_has.contains(&inode(&decoy).unwrap()));
    // The pin is a mount in QEMU's namespace (libvirt's per-domain one), not the launcher's.
    let in_qemu =
        std::path::Path::new(&format!("/proc/{qemu}/root")).join(pin.strip_prefix("/").unwrap());
    assert_eq!(inode(&in_qemu), Some(checked));
    assert_ne!(inode(&pin), Some(checked));
    assert_eq!(std::fs::read(&decoy).unwrap(), b"decoy\n");
    let start = std::fs::read(&moved).unwrap();
    assert!(start.starts_with(written.as_bytes()), "{:?}", &start[..32]);
    let live = common::live_xml(&vm.libvirt_uri(), &format!("default_{name}"));
    assert_eq!(
        live_disk_source(&live, "later").as_deref(),
        vm.dir().join("pins/later.img").to_str()
    );

    // Unplugged: QEMU let go of them, and their pins are gone, from QEMU's namespace too.
    let reply = client
        .sync(proto::SyncRequest {
            spec: spec_with(&[]),
            ..Default::default()
        })
        .await
        .expect("a Sync that unplugs both")
        .into_inner();
    assert!(
        reply.volumes.iter().all(|v| v.name == "data"),
        "{:?}",
        reply.volumes
    );
    assert!(!pin.exists());
    assert!(!vm.dir().join("pins/later.img").exists());
    let mounts = std::fs::read_to_string(format!("/proc/{qemu}/mountinfo")).unwrap();
    assert!(!mounts.contains("/pins/"), "{mounts}");
    assert!(!qemu_inodes(qemu).contains(&checked));

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

/// `late` → `Late`: the serials the test gives its volumes.
fn capitalised(volume: &str) -> String {
    let mut chars = volume.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// An overlay's backing (a container disk's `disk_N.img`, an ephemeral volume's claim) lies
/// where a tenant or an image author writes: libvirt is given the chain with the backing not to
/// be relabelled (its chown as root would follow a link put there after the launcher's check),
/// and QEMU gets the descriptor the launcher opened and checked, never the path: the file stays
/// root's, where QEMU's user cannot open it.
#[test]
fn overlay_backings_are_given_by_the_launcher_and_never_relabelled_by_libvirt() {
    use std::os::unix::fs::PermissionsExt;
    let name = "backing-given";
    let make_image = |path: &std::path::Path| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        common::sparse_file(path, 4);
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    let spec = guest_spec(name, "", &[])
        .replace(
            "      disks: []\n",
            "      disks:\n      - {name: image, disk: {bus: scsi}, serial: Image-1}\n      - {name: scratch, disk: {bus: scsi}, serial: Scratch-1}\n",
        )
        .replace(
            "  volumes: []\n",
            "  volumes:\n  - {name: image, containerDisk: {image: example/disk}}\n  - {name: scratch, ephemeral: {persistentVolumeClaim: {claimName: scratch}}}\n",
        );
    let mut vm = Launched::start_owned(|dir| {
        make_image(&dir.join("container-disks/disk_0.img"));
        make_image(&dir.join("vmi-disks/scratch/disk.img"));
    })
    .run(&spec, &[]);
    let mut console = vm.boot();
    console.line("the guest sees both disks", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-SERIALS")
            && l.contains("serial=Image-1")
            && l.contains("serial=Scratch-1")
    });
    let live = common::live_xml(&vm.libvirt_uri(), &format!("default_{name}"));
    let doc = roxmltree::Document::parse(&live).unwrap();
    let cmdline = command_line(vm.qemu_pid(name));
    for backing in ["container-disks/disk_0.img", "vmi-disks/scratch/disk.img"] {
        let path = vm.dir().join(backing);
        let source = doc
            .descendants()
            .find(|n| {
                n.has_tag_name("source")
                    && n.parent().is_some_and(|p| p.has_tag_name("backingStore"))
                    && n.attribute("file") == path.to_str()
            })
            .unwrap_or_else(|| panic!("no backingStore for {backing} in {live}"));
        let seclabel = source
            .children()
            .find(|n| n.has_tag_name("seclabel"))
            .unwrap_or_else(|| panic!("{backing}: no seclabel in {live}"));
        assert_eq!(seclabel.attribute("relabel"), Some("no"), "{backing}");
        assert!(source.attribute("fdgroup").is_some(), "{backing}: {live}");
        assert!(
            !cmdline.contains(path.to_str().unwrap()),
            "{backing}: {cmdline}"
        );
        assert_eq!(owner_and_mode(&path), (0, 0o600), "{backing}");
    }
    assert!(cmdline.contains("/dev/fdset/"), "{cmdline}");

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

/// A hot-pluggable file already there at start is in the definition the VM boots with: it is
/// pinned before QEMU starts, in libvirtd's mount namespace, which QEMU's is copied from, and
/// QEMU holds the checked inode through the pin. Unplugged, the pin goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_pluggable_file_present_at_start_is_pinned_before_qemu_starts() {
    use std::os::unix::fs::PermissionsExt;
    let name = "pin-at-start";
    let spec = |claims: &[(&str, &str)]| with_claims(guest_spec(name, "", &[]), claims);
    let mut vm = Launched::start_owned(|dir| {
        let image = dir.join("hotplug/early.img");
        std::fs::create_dir_all(image.parent().unwrap()).unwrap();
        common::sparse_file(&image, 4);
        std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o600)).unwrap();
    })
    .run(&spec(&[("early", "Early-1")]), &[]);
    let mut console = vm.boot();
    console.line("the guest sees the disk", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-SERIALS") && l.contains("serial=Early-1")
    });
    let checked = inode(&vm.dir().join("hotplug/early.img")).unwrap();
    let pin = vm.dir().join("pins/early.img");
    let live = common::live_xml(&vm.libvirt_uri(), &format!("default_{name}"));
    assert_eq!(
        live_disk_source(&live, "early").as_deref(),
        pin.to_str(),
        "{live}"
    );
    let qemu = vm.qemu_pid(name);
    assert!(
        qemu_inodes(qemu).contains(&checked),
        "QEMU holds the checked inode"
    );

    let mut client = api::connect(&vm.socket()).await.expect("gRPC socket");
    let reply = client
        .sync(proto::SyncRequest {
            spec: spec(&[]),
            ..Default::default()
        })
        .await
        .expect("a Sync that unplugs it")
        .into_inner();
    assert!(reply.volumes.is_empty(), "{:?}", reply.volumes);
    assert!(!pin.exists());
    let mounts = std::fs::read_to_string(format!("/proc/{qemu}/mountinfo")).unwrap();
    assert!(!mounts.contains("/pins/"), "{mounts}");
    assert!(!qemu_inodes(qemu).contains(&checked));

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

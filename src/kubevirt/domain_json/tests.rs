//! Expected values are KubeVirt's, written by hand from `util.ConvState`/`util.ConvReason`
//! (pkg/virt-launcher/virtwrap/util/libvirt_helper.go) and `api.Alias`'s `MarshalJSON`.

use super::*;

fn power(state: DomainState, reason: &str) -> PowerState {
    PowerState {
        state,
        reason: reason.to_string(),
    }
}

#[test]
fn states_and_reasons_as_kubevirt_converts_them() {
    use DomainState::*;
    let cases = [
        // ConvReason's default branch: these states' reasons are never translated.
        (Running, "booted", ("Running", "Unknown")),
        (Running, "unpaused", ("Running", "Unknown")),
        (Blocked, "unknown", ("Blocked", "Unknown")),
        (NoState, "unknown", ("NoState", "Unknown")),
        (PmSuspended, "unknown", ("PMSuspended", "Unknown")),
        (ShuttingDown, "user", ("ShuttingDown", "User")),
        (ShuttingDown, "unknown", ("ShuttingDown", "Unknown")),
        (Shutoff, "unknown", ("Shutoff", "Unknown")),
        (Shutoff, "shutdown", ("Shutoff", "Shutdown")),
        (Shutoff, "destroyed", ("Shutoff", "Destroyed")),
        (Shutoff, "crashed", ("Shutoff", "Crashed")),
        (Shutoff, "migrated", ("Shutoff", "Migrated")),
        (Shutoff, "saved", ("Shutoff", "Saved")),
        (Shutoff, "failed", ("Shutoff", "Failed")),
        (Shutoff, "from-snapshot", ("Shutoff", "FromSnapshot")),
        // Not in ShutoffReasonTranslationMap: Go's map miss is "".
        (Shutoff, "daemon", ("Shutoff", "")),
        (Crashed, "unknown", ("Crashed", "Unknown")),
        (Crashed, "panicked", ("Crashed", "Panicked")),
        (Paused, "unknown", ("Paused", "Unknown")),
        (Paused, "user", ("Paused", "User")),
        (Paused, "migration", ("Paused", "Migration")),
        (Paused, "save", ("Paused", "Save")),
        (Paused, "dump", ("Paused", "Dump")),
        (Paused, "ioerror", ("Paused", "IOError")),
        (Paused, "watchdog", ("Paused", "Watchdog")),
        (Paused, "from-snapshot", ("Paused", "FromSnapshot")),
        (Paused, "shutdown", ("Paused", "ShuttingDown")),
        (Paused, "snapshot", ("Paused", "Snapshot")),
        (Paused, "crashed", ("Paused", "Crashed")),
        (Paused, "starting-up", ("Paused", "StartingUp")),
        (Paused, "post-copy", ("Paused", "Postcopy")),
        (Paused, "postcopy-failed", ("Paused", "PostcopyFailed")),
        (Paused, "api-error", ("Paused", "")),
    ];
    for (state, reason, expected) in cases {
        assert_eq!(
            lifecycle(Some(&power(state, reason))),
            expected,
            "{state:?} ({reason})"
        );
    }
    assert_eq!(lifecycle(None), ("NoState", "NonExistent"));
}

#[test]
fn user_aliases_lose_their_prefix_and_say_so() {
    assert_eq!(
        alias_json("ua-rootdisk"),
        json!({"Name": "rootdisk", "UserDefined": true})
    );
    assert_eq!(
        alias_json("virtio-disk0"),
        json!({"Name": "virtio-disk0", "UserDefined": false})
    );
    // Only a leading prefix is the user's mark.
    assert_eq!(
        alias_json("net-ua-1"),
        json!({"Name": "net-ua-1", "UserDefined": false})
    );
    assert_eq!(alias_json("ua-"), json!({"Name": "", "UserDefined": true}));
}

const BARE: &str = r#"<domain type="kvm">
  <name>ns_vm</name>
  <memory unit="KiB">1024</memory>
  <devices>
    <disk type="file" device="cdrom"><target dev="sda" bus="sata"/></disk>
    <disk type="file" device="disk"><source file="/d.img"/><target dev="vda" bus="virtio"/><alias name="virtio-disk1"/></disk>
    <interface type="ethernet"><target dev="tap0"/></interface>
    <interface type="user"/>
  </devices>
</domain>"#;

fn meta() -> DomainMeta {
    DomainMeta {
        name: "vm".into(),
        namespace: "ns".into(),
        uid: "u-1".into(),
        ..DomainMeta::default()
    }
}

#[test]
fn devices_without_an_alias_or_mac_still_have_them() {
    let d = domain_json(BARE, &meta(), None).unwrap();
    let devices = &d["Spec"]["Devices"];
    assert_eq!(
        devices["Disks"][0]["Alias"],
        json!({"Name": "sda", "UserDefined": false})
    );
    assert_eq!(devices["Disks"][0]["Source"], json!({}));
    assert_eq!(
        devices["Disks"][1]["Alias"],
        json!({"Name": "virtio-disk1", "UserDefined": false})
    );
    assert_eq!(
        devices["Interfaces"][0]["Alias"],
        json!({"Name": "tap0", "UserDefined": false})
    );
    assert_eq!(
        devices["Interfaces"][1]["Alias"],
        json!({"Name": "net1", "UserDefined": false})
    );
    assert_eq!(devices["Interfaces"][1]["MAC"], json!({"MAC": ""}));
    assert_eq!(
        d["Status"],
        json!({"Status": "NoState", "Reason": "NonExistent"})
    );
    // No grace period known: none sent, as KubeVirt's pointer would be nil.
    assert_eq!(d["Spec"]["Metadata"], json!({"KubeVirt": {"UID": "u-1"}}));
}

#[test]
fn grace_period_fields_are_sent_when_known() {
    let m = DomainMeta {
        grace_deletion_timestamp: Some("2026-01-02T03:04:05Z".into()),
        ..meta()
    };
    let d = domain_json(BARE, &m, None).unwrap();
    assert_eq!(
        d["Spec"]["Metadata"]["KubeVirt"]["GracePeriod"],
        json!({"DeletionGracePeriodSeconds": 0, "DeletionTimestamp": "2026-01-02T03:04:05Z"})
    );
}

#[test]
fn oversized_or_crowded_xml_is_refused() {
    let huge = format!("<domain>{}</domain>", " ".repeat(MAX_XML_BYTES));
    assert!(matches!(
        domain_json(&huge, &meta(), None),
        Err(DomainJsonError::TooLarge { .. })
    ));
    let crowded = format!(
        "<domain><devices>{}</devices></domain>",
        "<rng/>".repeat(MAX_DEVICES + 1)
    );
    assert!(matches!(
        domain_json(&crowded, &meta(), None),
        Err(DomainJsonError::TooManyDevices { count, .. }) if count == MAX_DEVICES + 1
    ));
}

#[test]
fn bad_numbers_and_documents_are_errors() {
    let bad_memory = r#"<domain><memory unit="KiB">lots</memory></domain>"#;
    assert!(matches!(
        domain_json(bad_memory, &meta(), None),
        Err(DomainJsonError::BadNumber {
            element: "memory",
            ..
        })
    ));
    assert!(matches!(
        domain_json("<network/>", &meta(), None),
        Err(DomainJsonError::NotADomain(n)) if n == "network"
    ));
    assert!(matches!(
        domain_json("<domain>", &meta(), None),
        Err(DomainJsonError::Malformed(_))
    ));
}

#[test]
fn stats_without_cpu_or_dirty_rate_leave_them_null_and_bound_indices() {
    let params = vec![
        ("vcpu.4000000000.state".to_string(), StatValue::Int(1)),
        ("vcpu.maximum".to_string(), StatValue::UInt(u64::MAX)),
        ("net.x.name".to_string(), StatValue::String("tap0".into())),
        ("block.0".to_string(), StatValue::UInt(1)),
    ];
    let s = domain_stats_json("ns_vm", "u", &params, &Default::default());
    assert_eq!(s["Cpu"], Value::Null);
    assert_eq!(s["DirtyRate"], Value::Null);
    // The absurd maximum is capped, the absurd index dropped, the malformed names ignored.
    assert_eq!(s["Vcpu"].as_array().unwrap().len(), MAX_STAT_INDEX);
    assert_eq!(s["Vcpu"][0]["StateSet"], json!(false));
    assert_eq!(s["Net"], json!([]));
    assert_eq!(s["Block"], json!([]));
    assert_eq!(s["Memory"]["TotalSet"], json!(false));
}

#[test]
fn device_aliases_come_from_targets_without_the_user_prefix() {
    let d = domain_json(BARE, &meta(), None).unwrap();
    let aliases = device_aliases(&d);
    let expected: Vec<(&str, &str)> =
        vec![("sda", "sda"), ("tap0", "tap0"), ("vda", "virtio-disk1")];
    let got: Vec<(&str, &str)> = aliases
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(got, expected);
}

/// virt-handler sees a pinned hot-plugged file at its volume's path, as KubeVirt's launcher
/// names it; other sources as libvirt has them.
#[test]
fn a_pinned_file_is_shown_at_its_volumes_path() {
    let xml = r#"<domain type="kvm">
  <name>ns_vm</name>
  <memory unit="KiB">1024</memory>
  <devices>
    <disk type="file" device="disk"><source file="/run/vml/pins/late.img"><seclabel model="dac" relabel="no"/></source><target dev="sda" bus="scsi"/><alias name="ua-late"/></disk>
    <disk type="file" device="disk"><source file="/d.img"/><target dev="vda" bus="virtio"/><alias name="ua-root"/></disk>
  </devices>
</domain>"#;
    let mut m = meta();
    m.pins = Some((
        "/run/vml/pins".into(),
        "/var/run/kubevirt/hotplug-disks".into(),
    ));
    let d = domain_json(xml, &m, None).unwrap();
    let disks = &d["Spec"]["Devices"]["Disks"];
    assert_eq!(
        disks[0]["Source"]["File"],
        "/var/run/kubevirt/hotplug-disks/late.img"
    );
    assert_eq!(disks[1]["Source"]["File"], "/d.img");
    let plain = domain_json(xml, &meta(), None).unwrap();
    assert_eq!(
        plain["Spec"]["Devices"]["Disks"][0]["Source"]["File"],
        "/run/vml/pins/late.img"
    );
}

#[test]
fn a_freeze_shows_in_the_status_and_nothing_shows_before_one() {
    let mut meta = DomainMeta::default();
    assert!(gone_domain_json(&meta)["Status"]
        .get("FSFreezeStatus")
        .is_none());
    meta.fs_freeze_status = Some("frozen".into());
    assert_eq!(
        gone_domain_json(&meta)["Status"]["FSFreezeStatus"],
        serde_json::json!({"Status": "frozen"})
    );
}

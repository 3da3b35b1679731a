//! What the QEMU guest agent says, as KubeVirt's `GetGuestInfo`, `GetUsers` and
//! `GetFilesystems` answer it: `v1.VirtualMachineInstanceGuestAgentInfo`, a list of
//! `v1.VirtualMachineInstanceGuestOSUser` and one of `v1.VirtualMachineInstanceFileSystem`, keyed
//! by their Go JSON tags (`omitempty` ones left out when empty, as Go leaves them out).
//!
//! KubeVirt's launcher polls the agent (`agent-poller`) partly through libvirt's
//! `virDomainGetGuestInfo`, which reads the same agent commands asked for here; the values are
//! the agent's, converted as libvirt and KubeVirt convert them. The answers are the guest's:
//! bounded before they get here (`MAX_AGENT_ANSWER`), read leniently (a field of the wrong type
//! is a missing one), never trusted to be well formed. Pure: no I/O.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// The agent commands behind `GetGuestInfo`.
pub(crate) const GUEST_INFO_COMMANDS: &[&str] = &[
    "guest-info",
    "guest-get-osinfo",
    "guest-get-host-name",
    "guest-get-timezone",
    "guest-get-users",
    "guest-get-fsinfo",
];

/// How many users and filesystems `GetGuestInfo` lists (KubeVirt's `GetUsers(10)`/`GetFS(10)`);
/// `GetUsers` and `GetFilesystems` list all.
pub(crate) const GUEST_INFO_LIST_LIMIT: usize = 10;

/// The live XML's libvirt-managed nodes are a few hundred; the same bound as the domain's JSON.
const MAX_XML_NODES: u32 = 100_000;

/// Whether libvirt says the agent is connected: its channel's `<target state='connected'/>`
/// (libvirt tracks the guest opening the port). Without it an agent command only waits for its
/// timeout, so none is sent.
pub(crate) fn agent_connected(live_xml: &str) -> bool {
    if live_xml.len() > super::domain_json::MAX_XML_BYTES {
        return false;
    }
    let options = roxmltree::ParsingOptions {
        nodes_limit: MAX_XML_NODES,
        ..roxmltree::ParsingOptions::default()
    };
    let Ok(doc) = roxmltree::Document::parse_with_options(live_xml, options) else {
        return false;
    };
    crate::domain::agent_connected_in(&doc)
}

/// The `return` of an agent's answer (`{"return": ...}`), or `None` for an error, an answer that
/// does not parse, or one over `max` bytes.
pub(crate) fn agent_return(answer: &str, max: usize) -> Option<Value> {
    if answer.len() > max {
        return None;
    }
    let mut parsed: Value = serde_json::from_str(answer).ok()?;
    parsed.get_mut("return").map(Value::take)
}

/// The agent's answers by command: each command's `return`, missing when it did not answer.
pub(crate) type Answers = BTreeMap<String, Value>;

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// A count of bytes as Go's `int` holds it: clamped into `i64`, a non-number is 0.
fn count(v: &Value, key: &str) -> i64 {
    match v.get(key) {
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_u64().map(|_| i64::MAX))
            .unwrap_or_else(|| n.as_f64().map_or(0, |f| f as i64)),
        _ => 0,
    }
}

/// Inserts `value` under `key` unless it is Go's empty value for an `omitempty` string.
fn put_text(out: &mut Map<String, Value>, key: &str, value: String) {
    if !value.is_empty() {
        out.insert(key.into(), value.into());
    }
}

fn list(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// `guest-get-users` as `[]VirtualMachineInstanceGuestOSUser`, at most `limit` of them.
///
/// libvirt hands KubeVirt the login time in whole milliseconds and KubeVirt turns it back into
/// seconds, so the fraction keeps three digits.
pub(crate) fn users_json(users: Option<&Value>, limit: usize) -> Value {
    let users = list(users)
        .iter()
        .filter(|u| u.is_object())
        .take(limit)
        .map(|u| {
            let mut out = Map::new();
            out.insert("userName".into(), text(u, "user").into());
            put_text(&mut out, "domain", text(u, "domain"));
            let login = u.get("login-time").and_then(Value::as_f64).unwrap_or(0.0);
            let login = if login.is_finite() && login > 0.0 {
                (login * 1000.0).trunc() / 1000.0
            } else {
                0.0
            };
            // `loginTime` is omitempty: Go leaves a zero out.
            if login != 0.0 {
                out.insert("loginTime".into(), json!(login));
            }
            Value::Object(out)
        });
    Value::Array(users.collect())
}

/// `guest-get-fsinfo` as `[]VirtualMachineInstanceFileSystem`, at most `limit` of them.
pub(crate) fn filesystems_json(filesystems: Option<&Value>, limit: usize) -> Value {
    let filesystems = list(filesystems)
        .iter()
        .filter(|f| f.is_object())
        .take(limit)
        .map(|fs| {
            let mut out = Map::new();
            out.insert("diskName".into(), text(fs, "name").into());
            out.insert("mountPoint".into(), text(fs, "mountpoint").into());
            out.insert("fileSystemType".into(), text(fs, "type").into());
            out.insert("usedBytes".into(), count(fs, "used-bytes").into());
            out.insert("totalBytes".into(), count(fs, "total-bytes").into());
            let disks: Vec<Value> = list(fs.get("disk"))
                .iter()
                .map(|d| {
                    let mut disk = Map::new();
                    put_text(&mut disk, "serial", text(d, "serial"));
                    disk.insert("busType".into(), text(d, "bus-type").into());
                    Value::Object(disk)
                })
                .collect();
            // `disk` is omitempty.
            if !disks.is_empty() {
                out.insert("disk".into(), disks.into());
            }
            Value::Object(out)
        });
    Value::Array(filesystems.collect())
}

/// `VirtualMachineInstanceGuestAgentInfo` from the answers to [`GUEST_INFO_COMMANDS`]; `{}`
/// when the agent answered none (no agent: what the caller sends without asking).
pub(crate) fn guest_info_json(answers: &Answers) -> Value {
    if answers.is_empty() {
        return json!({});
    }
    let null = Value::Null;
    let get = |command: &str| answers.get(command).unwrap_or(&null);
    let mut out = Map::new();

    let info = get("guest-info");
    put_text(&mut out, "guestAgentVersion", text(info, "version"));
    let commands: Vec<Value> = list(info.get("supported_commands"))
        .iter()
        .map(|c| {
            let mut command = Map::new();
            command.insert("name".into(), text(c, "name").into());
            // `enabled` is omitempty: a disabled command has none.
            if c.get("enabled").and_then(Value::as_bool) == Some(true) {
                command.insert("enabled".into(), true.into());
            }
            Value::Object(command)
        })
        .collect();
    if !commands.is_empty() {
        out.insert("supportedCommands".into(), commands.into());
    }

    put_text(
        &mut out,
        "hostname",
        text(get("guest-get-host-name"), "host-name"),
    );

    // `os` is a struct: Go writes it even when all of it is empty.
    let osinfo = get("guest-get-osinfo");
    let mut os = Map::new();
    for (agent, kubevirt) in [
        ("name", "name"),
        ("kernel-release", "kernelRelease"),
        ("version", "version"),
        ("pretty-name", "prettyName"),
        ("version-id", "versionId"),
        ("kernel-version", "kernelVersion"),
        ("machine", "machine"),
        ("id", "id"),
    ] {
        put_text(&mut os, kubevirt, text(osinfo, agent));
    }
    out.insert("os".into(), Value::Object(os));

    // KubeVirt writes `fmt.Sprintf("%s, %d", zone, offset)`; the agent may leave the zone out.
    if let Some(tz) = answers.get("guest-get-timezone") {
        let offset = tz.get("offset").and_then(Value::as_i64).unwrap_or(0);
        out.insert(
            "timezone".into(),
            format!("{}, {offset}", text(tz, "zone")).into(),
        );
    }

    let users = users_json(answers.get("guest-get-users"), GUEST_INFO_LIST_LIMIT);
    if users.as_array().is_some_and(|u| !u.is_empty()) {
        out.insert("userList".into(), users);
    }

    // `fsInfo` is a struct whose `disks` has no omitempty: null when Go's slice is nil.
    let filesystems = filesystems_json(answers.get("guest-get-fsinfo"), GUEST_INFO_LIST_LIMIT);
    let disks = match filesystems {
        Value::Array(a) if a.is_empty() => Value::Null,
        other => other,
    };
    out.insert("fsInfo".into(), json!({ "disks": disks }));
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(pairs: &[(&str, &str)]) -> Answers {
        pairs
            .iter()
            .filter_map(|(c, a)| Some((c.to_string(), agent_return(a, 1 << 20)?)))
            .collect()
    }

    #[test]
    fn agent_channel_state_is_read_from_the_live_xml() {
        let xml = |state: &str| {
            format!(
                "<domain><devices><channel type='unix'><source mode='bind'/>\
                 <target type='virtio' name='org.qemu.guest_agent.0'{state}/></channel>\
                 </devices></domain>"
            )
        };
        assert!(agent_connected(&xml(" state='connected'")));
        assert!(!agent_connected(&xml(" state='disconnected'")));
        assert!(!agent_connected(&xml("")));
        assert!(!agent_connected("<domain><devices/></domain>"));
        assert!(!agent_connected("not xml"));
    }

    #[test]
    fn an_answer_is_its_return_when_bounded_and_well_formed() {
        assert_eq!(
            agent_return(r#"{"return": {"host-name": "g"}}"#, 100),
            Some(json!({"host-name": "g"}))
        );
        assert_eq!(agent_return(r#"{"return": {"host-name": "g"}}"#, 10), None);
        assert_eq!(agent_return(r#"{"error": {"class": "x"}}"#, 100), None);
        assert_eq!(agent_return(r#"{"return": "#, 100), None);
        assert_eq!(agent_return("[1]", 100), None);
    }

    /// The agent's answers of a Fedora guest (shapes from qemu-ga's QAPI schema), mapped by the
    /// JSON tags of KubeVirt's `v1` types.
    #[test]
    fn guest_info_maps_every_command() {
        let a = answers(&[
            (
                "guest-info",
                r#"{"return": {"version": "8.1.3", "supported_commands": [
                    {"enabled": true, "name": "guest-get-osinfo", "success-response": true},
                    {"enabled": false, "name": "guest-exec", "success-response": true}]}}"#,
            ),
            (
                "guest-get-osinfo",
                r##"{"return": {"name": "Fedora Linux", "kernel-release": "6.5.6-300.fc39.x86_64",
                    "version": "39 (Cloud Edition)", "pretty-name": "Fedora Linux 39 (Cloud Edition)",
                    "version-id": "39", "kernel-version": "#1 SMP PREEMPT_DYNAMIC",
                    "machine": "x86_64", "id": "fedora", "variant": "Cloud Edition"}}"##,
            ),
            (
                "guest-get-host-name",
                r#"{"return": {"host-name": "testvmi"}}"#,
            ),
            (
                "guest-get-timezone",
                r#"{"return": {"zone": "CET", "offset": 3600}}"#,
            ),
            (
                "guest-get-users",
                r#"{"return": [{"user": "fedora", "login-time": 1700000000.123456},
                               {"user": "Administrator", "domain": "CORP", "login-time": 0}]}"#,
            ),
            (
                "guest-get-fsinfo",
                r#"{"return": [{"name": "vda5", "mountpoint": "/", "type": "btrfs",
                    "used-bytes": 1048576, "total-bytes": 4194304,
                    "disk": [{"serial": "disk0", "bus-type": "virtio", "bus": 0, "unit": 0,
                              "target": 0, "pci-controller": {"domain": 0, "bus": 0, "slot": 7, "function": 0}}]},
                    {"name": "vdb", "mountpoint": "/data", "type": "xfs", "disk": []}]}"#,
            ),
        ]);
        assert_eq!(
            guest_info_json(&a),
            json!({
                "guestAgentVersion": "8.1.3",
                "supportedCommands": [
                    {"name": "guest-get-osinfo", "enabled": true},
                    {"name": "guest-exec"},
                ],
                "hostname": "testvmi",
                "os": {
                    "name": "Fedora Linux",
                    "kernelRelease": "6.5.6-300.fc39.x86_64",
                    "version": "39 (Cloud Edition)",
                    "prettyName": "Fedora Linux 39 (Cloud Edition)",
                    "versionId": "39",
                    "kernelVersion": "#1 SMP PREEMPT_DYNAMIC",
                    "machine": "x86_64",
                    "id": "fedora",
                },
                "timezone": "CET, 3600",
                "userList": [
                    {"userName": "fedora", "loginTime": 1700000000.123},
                    {"userName": "Administrator", "domain": "CORP"},
                ],
                "fsInfo": {"disks": [
                    {"diskName": "vda5", "mountPoint": "/", "fileSystemType": "btrfs",
                     "usedBytes": 1048576, "totalBytes": 4194304,
                     "disk": [{"serial": "disk0", "busType": "virtio"}]},
                    {"diskName": "vdb", "mountPoint": "/data", "fileSystemType": "xfs",
                     "usedBytes": 0, "totalBytes": 0},
                ]},
            })
        );
    }

    #[test]
    fn guest_info_without_answers_is_empty_and_partial_answers_keep_go_shapes() {
        assert_eq!(guest_info_json(&Answers::new()), json!({}));
        let a = answers(&[
            ("guest-info", r#"{"return": {"version": "5.2.0"}}"#),
            ("guest-get-timezone", r#"{"return": {"offset": 0}}"#),
        ]);
        assert_eq!(
            guest_info_json(&a),
            json!({
                "guestAgentVersion": "5.2.0",
                "os": {},
                "timezone": ", 0",
                "fsInfo": {"disks": null},
            })
        );
    }

    #[test]
    fn guest_info_lists_ten_users_and_filesystems_the_calls_all() {
        let users: Vec<Value> = (0..12).map(|i| json!({"user": format!("u{i}")})).collect();
        let fs: Vec<Value> = (0..12).map(|i| json!({"name": format!("d{i}")})).collect();
        let mut a = Answers::new();
        a.insert("guest-get-users".into(), users.clone().into());
        a.insert("guest-get-fsinfo".into(), fs.clone().into());
        let info = guest_info_json(&a);
        assert_eq!(info["userList"].as_array().unwrap().len(), 10);
        assert_eq!(info["fsInfo"]["disks"].as_array().unwrap().len(), 10);
        let all_users = users_json(Some(&users.into()), usize::MAX);
        assert_eq!(all_users.as_array().unwrap().len(), 12);
        assert_eq!(all_users[11], json!({"userName": "u11"}));
        let all_fs = filesystems_json(Some(&fs.into()), usize::MAX);
        assert_eq!(all_fs.as_array().unwrap().len(), 12);
        assert_eq!(
            all_fs[0],
            json!({"diskName": "d0", "mountPoint": "", "fileSystemType": "",
                   "usedBytes": 0, "totalBytes": 0})
        );
    }

    /// A guest's nonsense is read as missing fields, never a panic.
    #[test]
    fn malformed_agent_data_is_tolerated() {
        assert_eq!(users_json(Some(&json!({"user": "x"})), 10), json!([]));
        assert_eq!(users_json(None, 10), json!([]));
        assert_eq!(
            users_json(
                Some(
                    &json!([7, {"user": 3, "login-time": "soon"}, {"user": "a", "login-time": -1}])
                ),
                10
            ),
            json!([{"userName": ""}, {"userName": "a"}])
        );
        assert_eq!(
            filesystems_json(
                Some(
                    &json!([{"name": "v", "used-bytes": u64::MAX, "total-bytes": -5,
                              "disk": "x"}])
                ),
                10
            ),
            json!([{"diskName": "v", "mountPoint": "", "fileSystemType": "",
                    "usedBytes": i64::MAX, "totalBytes": -5}])
        );
        let mut a = Answers::new();
        a.insert("guest-info".into(), json!("a string"));
        a.insert("guest-get-timezone".into(), json!([1]));
        assert_eq!(
            guest_info_json(&a),
            json!({"os": {}, "timezone": ", 0", "fsInfo": {"disks": null}})
        );
    }
}

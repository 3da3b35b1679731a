//! Network interfaces plugged and unplugged through Sync (KubeVirt's interface hotplug), on a
//! real TCG guest against a real private libvirtd, proven by the guest (`VMLTEST-NICS`: each NIC
//! with its MAC and carrier) and by a published port that answers:
//! - a VM booted without a NIC gets its masquerade interface, with its published port, by Sync;
//!   the guest takes a lease and its HTTP server answers on the host's port;
//! - a second interface (a Multus network, bridge binding: a user-mode network of its own on a
//!   local run) appears in the guest with its MAC, goes down and up with `state`, and leaves
//!   with `state: absent`;
//! - a launcher killed with SIGKILL and started again adopts both and has nothing to redo;
//! - changing what an interface is (its model) is refused and changes nothing.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use common::{cli_status, guest_spec, Launched, GUEST_DEADLINE};
use vmlauncher::console::ConsoleLog;

const NAME: &str = "e2e-nics";
const SECOND_MAC: &str = "02:00:00:00:00:02";

/// The test guest without a NIC of its own, its HTTP server on `port`, with `interfaces` and
/// `networks` (YAML list items, indented for their place).
fn spec(port: u16, interfaces: &str, networks: &str) -> String {
    let text = guest_spec(NAME, &format!("vmltest.http_port={port}"), &[]).replace(
        "    devices:\n",
        &format!(
            "    devices:\n      autoattachPodInterface: false\n      interfaces:{interfaces}\n"
        ),
    );
    format!("{text}  networks:{networks}\n")
}

fn default_nic(port: u16, model: &str) -> String {
    format!("\n      - name: default\n        masquerade: {{}}\n        model: {model}\n        ports: [{{port: {port}}}]")
}

fn second_nic(state: &str) -> String {
    format!("\n      - name: second\n        bridge: {{}}\n        macAddress: \"{SECOND_MAC}\"\n        state: {state}")
}

const DEFAULT_NET: &str = "\n  - {name: default, pod: {}}";
const SECOND_NET: &str = "\n  - {name: second, multus: {networkName: second-net}}";

fn sync(vm: &Launched, text: &str) -> serde_json::Value {
    common::cli_sync(&vm.socket(), vm.scratch(), text)
}

fn changes(reply: &serde_json::Value) -> Vec<(String, String, String)> {
    reply["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["action"].as_str().unwrap().to_string(),
                c["error"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn done(name: &str, action: &str) -> (String, String, String) {
    (name.to_string(), action.to_string(), String::new())
}

/// The interfaces a status shows, by name.
fn interface_names(status: &serde_json::Value) -> Vec<String> {
    status["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect()
}

fn nics_line(console: &mut ConsoleLog, what: &str, wanted: impl Fn(&str) -> bool) -> String {
    console
        .wait_for(what, Instant::now() + GUEST_DEADLINE, |l| {
            l.starts_with("VMLTEST-NICS") && wanted(l)
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn interfaces_come_go_and_change_link_in_the_running_guest() {
    let port = common::net::free_port();
    let mut vm = Launched::start(&spec(port, " []", " []"), &[]);
    let mut console = vm.boot();
    nics_line(&mut console, "no NIC at boot", |l| l == "VMLTEST-NICS");

    // The pod network's interface, with its published port.
    let with_default = spec(port, &default_nic(port, "virtio"), DEFAULT_NET);
    let reply = sync(&vm, &with_default);
    assert_eq!(changes(&reply), vec![done("default", "attach")]);
    console
        .wait_for(
            "the guest's HTTP server",
            Instant::now() + GUEST_DEADLINE,
            |l| l == format!("VMLTEST-HTTP testguest {port}"),
        )
        .unwrap();
    let page = common::net::http_get(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), "/")
        .expect("the published port answers");
    assert!(page.contains("vmltest testguest"), "{page}");
    let status = cli_status(&vm.socket());
    assert_eq!(status["interfaces"][0]["name"], "default", "{status}");
    assert_eq!(
        status["interfaces"][0]["ports"][0]["hostPort"], port,
        "{status}"
    );

    // A second one, on a network of its own.
    let with = |state: &str| {
        spec(
            port,
            &format!("{}{}", default_nic(port, "virtio"), second_nic(state)),
            &format!("{DEFAULT_NET}{SECOND_NET}"),
        )
    };
    assert_eq!(
        changes(&sync(&vm, &with("up"))),
        vec![done("second", "attach")]
    );
    nics_line(&mut console, "the second NIC", |l| {
        l.contains(&format!(":{SECOND_MAC}:up"))
    });
    assert_eq!(
        changes(&sync(&vm, &with("down"))),
        vec![done("second", "link-down")]
    );
    nics_line(&mut console, "its link down", |l| {
        l.contains(&format!(":{SECOND_MAC}:down"))
    });
    assert_eq!(
        changes(&sync(&vm, &with("up"))),
        vec![done("second", "link-up")]
    );
    nics_line(&mut console, "its link up", |l| {
        l.contains(&format!(":{SECOND_MAC}:up"))
    });
    // The same again changes nothing.
    assert_eq!(changes(&sync(&vm, &with("up"))), vec![]);

    // SIGKILL and a new launcher (given the spec it booted with): it adopts both interfaces,
    // restores the last Sync, and has nothing to change for it.
    vm.kill9();
    let mut vm = vm.successor(&spec(port, " []", " []"), &[]);
    vm.wait_stdout("phase Running", GUEST_DEADLINE);
    let status = cli_status(&vm.socket());
    let names = interface_names(&status);
    assert_eq!(names, vec!["default", "second"], "{status}");
    assert_eq!(changes(&sync(&vm, &with("up"))), vec![]);

    // What an interface is cannot change while the VM runs.
    let other_model = spec(port, &default_nic(port, "e1000"), DEFAULT_NET);
    let (code, stderr) = common::cli_sync_refused(&vm.socket(), vm.scratch(), &other_model);
    assert_eq!(code, Some(6), "{stderr}");
    assert!(
        stderr.contains("spec.domain.devices.interfaces"),
        "{stderr}"
    );

    // Unplugged: gone from the guest and from the status.
    assert_eq!(
        changes(&sync(&vm, &with("absent"))),
        vec![done("second", "detach")]
    );
    nics_line(&mut console, "the second NIC gone", |l| {
        !l.contains(SECOND_MAC)
    });
    let status = cli_status(&vm.socket());
    let names = interface_names(&status);
    assert_eq!(names, vec!["default"], "{status}");
    let page = common::net::http_get(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), "/")
        .expect("the published port still answers");
    assert!(page.contains("vmltest testguest"), "{page}");

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        vm.wait_exit(std::time::Duration::from_secs(120)).code(),
        Some(0)
    );
}

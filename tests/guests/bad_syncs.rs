//! The bad-spec corpus (`tests/data/bad-specs/`) sent to `Sync` on a running VM with a hot-plugged
//! disk: every spec is refused with INVALID_ARGUMENT and its own error, and afterwards the domain
//! (libvirt's live XML), the status, and the guest's disks are what they were. The one case a
//! gRPC client cannot send — bytes that are not UTF-8 in a proto `string` — is left out.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{guest_spec, live_xml, Launched, GUEST_DEADLINE};
use vmlauncher::api::{self, proto};

/// The status is compared before and after refused or empty Syncs: a guest agent connecting on
/// its own meanwhile would change it (`AgentConnected`).
const NO_AGENT: &str = "vmltest.agent=off";

fn corpus() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad-specs");
    std::fs::read_to_string(dir.join("EXPECTED"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (file, expect) = l.split_once('\t').unwrap();
            let text = String::from_utf8(std::fs::read(dir.join(file)).unwrap()).ok()?;
            Some((text, format!("{file}\t{expect}")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_spec_sent_to_sync_is_refused_and_changes_nothing() {
    let name = "e2e-bad-syncs";
    let mut vm = Launched::start(&guest_spec(name, NO_AGENT, &[]), &[]);
    let mut console = vm.boot();
    let image = vm.scratch().join("kept.img");
    common::sparse_file(&image, 8);
    let good = guest_spec(name, NO_AGENT, &[("kept", "Kept-Serial", &image)]);
    let mut client = api::connect(&vm.socket()).await.expect("gRPC socket");
    client
        .sync(proto::SyncRequest {
            spec: good.clone(),
            ..Default::default()
        })
        .await
        .expect("Sync of one disk");
    console
        .wait_for(
            "the guest seeing the disk",
            Instant::now() + GUEST_DEADLINE,
            |l| l.starts_with("VMLTEST-DISKS") && l.contains(":Kept-Serial:"),
        )
        .unwrap();
    let uri = vm.libvirt_uri();
    let domain = format!("default_{name}");
    let xml_before = live_xml(&uri, &domain);
    let status_before = common::status(&mut client).await;

    let cases = corpus();
    assert!(cases.len() >= 60, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for (text, case) in cases {
        let (file, expect) = case.split_once('\t').unwrap();
        let reply = tokio::time::timeout(
            Duration::from_secs(30),
            client.sync(proto::SyncRequest {
                spec: text,
                ..Default::default()
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("{file}: no answer within 30 s"));
        match reply {
            Err(status)
                if status.code() == tonic::Code::InvalidArgument
                    && status.message().contains(expect) => {}
            Err(status) => failures.push(format!(
                "{file}: {:?} {:?}, want InvalidArgument and {expect:?}",
                status.code(),
                status.message().chars().take(300).collect::<String>()
            )),
            Ok(_) => failures.push(format!("{file}: accepted")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} bad Syncs not refused as expected:\n{}",
        failures.len(),
        failures.join("\n")
    );

    assert_eq!(
        live_xml(&uri, &domain),
        xml_before,
        "a refused Sync touched the domain"
    );
    assert_eq!(
        common::status(&mut client).await,
        status_before,
        "a refused Sync changed the status"
    );
    // The guest still has its disk: the same spec again plans nothing.
    let reply = client
        .sync(proto::SyncRequest {
            spec: good,
            ..Default::default()
        })
        .await
        .expect("the good spec again")
        .into_inner();
    assert!(reply.plan.is_empty(), "{:?}", reply.plan);
    drop(client);
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(Duration::from_secs(90)).code(), Some(0));
}

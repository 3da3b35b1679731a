//! Conversion speed: parse + validate a VMI, and convert it to domain XML, for a 4-disk and a
//! 64-disk instance. Run with `cargo bench --bench convert`; compare against the base branch.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use vmlauncher::convert::{convert, ConvertOptions};
use vmlauncher::domain::VirtType;

/// A VMI with `n` disks: a container disk, a cloud-init seed, then scsi and virtio data disks
/// with serials, on hostDisk, PVC and emptyDisk volumes.
fn vmi(n: usize) -> String {
    let mut disks = String::new();
    let mut volumes = String::new();
    for i in 0..n {
        let (disk, volume) = match i {
            0 => (
                "{name: root, bootOrder: 1}".to_string(),
                "{name: root, containerDisk: {image: quay.io/containerdisks/fedora:40}}".to_string(),
            ),
            1 => (
                "{name: cloudinit}".to_string(),
                "{name: cloudinit, cloudInitNoCloud: {userData: \"#cloud-config\\npassword: x\\n\"}}"
                    .to_string(),
            ),
            _ => {
                let bus = if i % 2 == 0 { "scsi" } else { "virtio" };
                let source = match i % 3 {
                    0 => format!("hostDisk: {{path: /data/d{i}.img, type: Disk}}"),
                    1 => format!("persistentVolumeClaim: {{claimName: claim-{i}}}"),
                    _ => "emptyDisk: {capacity: 1Gi}".to_string(),
                };
                (
                    format!("{{name: d{i}, disk: {{bus: {bus}}}, serial: SERIAL-{i:04}, cache: none}}"),
                    format!("{{name: d{i}, {source}}}"),
                )
            }
        };
        disks += &format!("      - {disk}\n");
        volumes += &format!("  - {volume}\n");
    }
    format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: bench
  namespace: default
spec:
  domain:
    cpu: {{sockets: 2, cores: 2, model: host-model}}
    memory: {{guest: 4Gi}}
    features: {{acpi: {{}}, smm: {{}}}}
    devices:
      rng: {{}}
      interfaces:
      - {{name: default, masquerade: {{}}}}
      disks:
{disks}  networks:
  - {{name: default, pod: {{}}}}
  volumes:
{volumes}"#
    )
}

fn bench(c: &mut Criterion) {
    let opts = ConvertOptions::new(VirtType::Kvm, "/var/run/vmlauncher/console.log".into());
    for n in [4, 64] {
        let text = vmi(n);
        let parsed = vmlauncher::spec::parse(&text).expect("the bench spec is valid");
        c.bench_function(&format!("parse+validate {n} disks"), |b| {
            b.iter(|| vmlauncher::spec::parse(black_box(&text)).unwrap())
        });
        c.bench_function(&format!("convert+xml {n} disks"), |b| {
            b.iter(|| convert(black_box(&parsed), &opts).unwrap().to_xml())
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

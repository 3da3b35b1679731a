//! What a Sync does before it touches anything, at 4, 64 and 256 hot-plugged disks: parse
//! libvirt's live domain XML (`domain::live_disks`), and plan (`hotplug::plan`: the live disks
//! against the converted spec) when nothing changes and when one disk is to be attached.
//! Run with `cargo bench --bench live_xml`; compare against the base branch.
//!
//! The live XML is what libvirt 9.0 returned for the running test guest with one hot-plugged
//! scsi disk (`virsh dumpxml`, paths shortened: `benches/data/`), its `<disk>` repeated with
//! the target, unit, alias, serial and source of each disk, as libvirt writes them.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use vmlauncher::convert::{convert, ConvertOptions};
use vmlauncher::domain::{live_disks, target_name, VirtType};
use vmlauncher::hotplug::plan;

const LIVE_ONE_DISK: &str = include_str!("data/live-domain-1-scsi-disk.xml");

/// The recorded live XML with `n` hot-plugged scsi disks instead of its one.
fn live_xml(n: u32) -> String {
    let start = LIVE_ONE_DISK
        .find("    <disk ")
        .expect("a <disk> in the fixture");
    let end = LIVE_ONE_DISK[start..].find("</disk>\n").expect("its end") + start + 8;
    let one = &LIVE_ONE_DISK[start..end];
    let disks: String = (0..n)
        .map(|i| {
            one.replace("/data/d1.img", &format!("/data/d{i}.img"))
                .replace("index='1'", &format!("index='{}'", i + 1))
                .replace("dev='sda'", &format!("dev='{}'", target_name("sd", i)))
                .replace("<serial>D1</serial>", &format!("<serial>D{i}</serial>"))
                .replace("ua-d1", &format!("ua-d{i}"))
                .replace("unit='0'", &format!("unit='{i}'"))
        })
        .collect();
    format!(
        "{}{disks}{}",
        &LIVE_ONE_DISK[..start],
        &LIVE_ONE_DISK[end..]
    )
}

/// The spec of the same guest with `n` scsi disks on hostDisk volumes.
fn spec(n: u32) -> String {
    let mut disks = String::new();
    let mut volumes = String::new();
    for i in 0..n {
        disks += &format!("      - {{name: d{i}, disk: {{bus: scsi}}, serial: D{i}}}\n");
        volumes += &format!("  - {{name: d{i}, hostDisk: {{path: /data/d{i}.img, type: Disk}}}}\n");
    }
    format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {{name: pp}}\nspec:\n  \
         domain:\n    memory: {{guest: 256Mi}}\n    firmware:\n      kernelBoot:\n        \
         kernelArgs: console=ttyS0 loglevel=1\n        container: {{kernelPath: /guest/vmlinuz, \
         initrdPath: /guest/initrd.img}}\n    devices:\n      disks:\n{disks}  volumes:\n{volumes}"
    )
}

fn bench(c: &mut Criterion) {
    let opts = ConvertOptions::new(VirtType::Qemu, "/run/vm/console.log".into());
    let mut parse = c.benchmark_group("parse live XML");
    for n in [4, 64, 256] {
        let xml = live_xml(n);
        assert_eq!(live_disks(&xml).unwrap().len(), n as usize);
        parse.bench_with_input(BenchmarkId::from_parameter(n), &xml, |b, xml| {
            b.iter(|| live_disks(black_box(xml)).unwrap())
        });
    }
    parse.finish();

    let mut planning = c.benchmark_group("plan Sync");
    for n in [4, 64, 256] {
        // n disks wanted (256 is the most a spec may have): all live, or all but the last.
        let wanted = convert(&vmlauncher::spec::parse(&spec(n)).unwrap(), &opts).unwrap();
        let live = live_disks(&live_xml(n)).unwrap();
        let live_but_one = live_disks(&live_xml(n - 1)).unwrap();
        let p = plan(&live, &wanted).unwrap();
        assert!(p.attach.is_empty() && p.detach.is_empty(), "{p:?}");
        assert_eq!(plan(&live_but_one, &wanted).unwrap().attach.len(), 1);
        planning.bench_with_input(BenchmarkId::new("nothing to change", n), &n, |b, _| {
            b.iter(|| plan(black_box(&live), black_box(&wanted)).unwrap())
        });
        planning.bench_with_input(BenchmarkId::new("one disk to attach", n), &n, |b, _| {
            b.iter(|| plan(black_box(&live_but_one), black_box(&wanted)).unwrap())
        });
    }
    planning.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

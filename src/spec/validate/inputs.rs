//! `spec.domain.devices.inputs` and `.watchdog`.

use std::collections::BTreeSet;

use super::Problems;
use crate::spec::checks::check_dns1123_label;
use crate::spec::model::Devices;
use crate::spec::problem::Problem;

pub(super) fn validate_inputs(devices: &Devices, e: &mut Problems) {
    let base = "spec.domain.devices";
    let mut seen_inputs = BTreeSet::new();
    for (i, input) in devices.inputs.iter().enumerate() {
        let path = format!("{base}.inputs[{i}]");
        e.unique(&mut seen_inputs, &path, "input", &input.name);
        if let Err(why) = check_dns1123_label(&input.name) {
            e.add(format!("{path}.name"), why);
        }
        e.one_of(
            format!("{path}.type"),
            &input.input_type,
            &["tablet", "keyboard"],
        );
        if let Some(bus) = &input.bus {
            e.one_of(format!("{path}.bus"), bus, &["usb", "virtio"]);
        }
    }
    if let Some(w) = &devices.watchdog {
        let path = format!("{base}.watchdog");
        if let Err(why) = check_dns1123_label(&w.name) {
            e.add(format!("{path}.name"), why);
        }
        match &w.i6300esb {
            None => e.add(
                path,
                Problem::Missing {
                    what: "a watchdog",
                    needs: "a model",
                    supported: "i6300esb",
                },
            ),
            Some(m) => {
                if let Some(action) = &m.action {
                    e.one_of(
                        format!("{path}.i6300esb.action"),
                        action,
                        &["poweroff", "reset", "shutdown"],
                    );
                }
            }
        }
    }
}

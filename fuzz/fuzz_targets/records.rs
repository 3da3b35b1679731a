//! Any bytes as the hotplug records file: parsing and vetting never panic, and what vetting keeps
//! is inside the hotplug dir.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vmlauncher::fuzzing::records(data);
});

//! Any text as libvirt's live domain XML: the disk parser that Sync diffs against never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vmlauncher::fuzzing::live_xml(data);
});

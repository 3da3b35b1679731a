//! Any bytes as a spec: reading, validating and, when valid, converting to XML must never panic,
//! and what converts must be well-formed XML.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vmlauncher::fuzzing::spec(data);
});

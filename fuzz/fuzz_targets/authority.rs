//! Any bytes, cut into reads of any size, as a client's side of an API connection through the
//! `:authority` rewriter: it never panics, its output per read stays within one header list of
//! its input, and a rewritten connection's header blocks decode and carry only valid authorities.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vmlauncher::fuzzing::authority(data);
});

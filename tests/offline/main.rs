//! The fast tier: every integration test that needs no VM and no pod (the CLI, specs refused
//! before anything starts, the domain XML and KubeVirt's files against their fixtures). One
//! binary, so `tests/common` is compiled and the crate linked once; `scripts/fast-tests.sh`
//! runs it with the unit tests. Each module was a test binary of its own.

#[path = "../common/mod.rs"]
mod common;

mod bad_specs;
mod cli;
mod kubevirt_domain_json;
mod kubevirt_examples;
mod kubevirt_protos;
mod xml_fixtures;

//! The binary's front end, apart from `main`: argument parsing, the client verbs, their output,
//! and the spec editing of `addvolume`/`removevolume`.

pub(crate) mod args;
pub(crate) mod client;
pub(crate) mod output;
pub(crate) mod spec_edit;

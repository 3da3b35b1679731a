//! Blocking host work done from an async task (a leaf: every part of the launcher uses it).

/// Blocking host work (mknod, cgroup and records writes, file I/O) done from a task: the worker
/// thread hands its other tasks over first, so the runtime's few workers keep serving the API,
/// the event stream and the reconciler meanwhile. (The launcher runs on a multi-thread runtime.)
pub(super) fn host_work<T>(work: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(work)
}

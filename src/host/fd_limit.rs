//! The launcher's descriptor limit: its soft `RLIMIT_NOFILE` raised to the hard one at start, for
//! it and for the libvirtd it starts (which inherits it). The soft limit is 1024 under systemd
//! services and containerd ≥ 2.0: a migration target's ports, each connection a descriptor,
//! would run a launcher out of them long before its other limits (security review N-4).

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Raises the soft limit to the hard one; the limits after, `(soft, hard)`.
pub fn raise_to_hard() -> nix::Result<(u64, u64)> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    getrlimit(Resource::RLIMIT_NOFILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        // From below, whatever this process was given: a soft limit may always be lowered.
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        setrlimit(Resource::RLIMIT_NOFILE, hard.min(1024) - 1, hard).unwrap();
        assert_eq!(raise_to_hard().unwrap(), (hard, hard));
    }
}

//! Keeping the guest off the host's loopback. QEMU's user-mode network (libslirp) turns a guest's
//! connection to its gateway (10.0.2.2, fec0::2) into a connection from QEMU to 127.0.0.1 or ::1,
//! and QEMU does not expose libslirp's switch against it. In a pod that loopback is every
//! sidecar's admin port; on a host it is every local service. So, when asked, the launcher closes
//! it where QEMU runs: cgroup socket-address programs that refuse QEMU's user (and no one else)
//! a TCP connect or a UDP send to a loopback address, except DNS (port 53: libslirp forwards the
//! guest's queries to the host's resolver, which may listen there). They are attached to the
//! launcher's own cgroup v2, where its libvirtd and QEMU run, through BPF links that the kernel
//! detaches when the launcher exits. Connections into the guest (published ports) are accepted by
//! QEMU, never connected, and are not affected.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    #[error("QEMU runs as root here: a rule by user would close the loopback to the launcher and every root process of its cgroup")]
    RootQemu,
    #[error("no cgroup v2 here to attach the rule to")]
    NoCgroup2,
    #[error("cannot open the cgroup {path}")]
    OpenCgroup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the kernel refused the {hook} program: {source}; verifier: {log}")]
    Load {
        hook: &'static str,
        source: std::io::Error,
        log: String,
    },
    #[error("cannot attach the {hook} program to {path}")]
    Attach {
        hook: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// While held, QEMU's user cannot reach the loopback from `cgroup`; dropped (or the launcher
/// gone), the rule is gone.
#[derive(Debug)]
pub(crate) struct LoopbackClosed {
    _links: Vec<OwnedFd>,
    pub cgroup: PathBuf,
}

/// The annotation by which a VMI asks that its guest may reach the host's (the pod's) loopback.
pub(crate) const OPEN_ANNOTATION: &str = "vmlauncher.io/guest-reaches-host-loopback";

/// `--guest-loopback`: whether the guest reaches the host's loopback through QEMU's user-mode
/// network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GuestLoopback {
    Open,
    Closed,
}

impl GuestLoopback {
    /// The flag if given; else closed in a pod unless the VMI asks for it (`OPEN_ANNOTATION:
    /// "true"`), open on a host run (its loopback is the owner's own, as documented).
    pub(crate) fn decide(
        flag: Option<GuestLoopback>,
        in_pod: bool,
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> GuestLoopback {
        match flag {
            Some(given) => given,
            None if in_pod
                && annotations.get(OPEN_ANNOTATION).map(String::as_str) != Some("true") =>
            {
                GuestLoopback::Closed
            }
            None => GuestLoopback::Open,
        }
    }
}

/// Closes the loopback for QEMU's user in this process's own cgroup v2 (where its libvirtd and
/// QEMU run). `mount_at`: where to mount the unified hierarchy if it is not mounted (a
/// container's PID 1, whose mount namespace is its own); `None` on a host.
pub(crate) fn close_here(
    qemu_uid: u32,
    mount_at: Option<&Path>,
) -> Result<LoopbackClosed, LoopbackError> {
    let mut roots =
        crate::host::cgroup::CgroupRoots::detect().map_err(|_| LoopbackError::NoCgroup2)?;
    if let Some(dir) = mount_at {
        roots = roots
            .with_unified(dir)
            .map_err(|_| LoopbackError::NoCgroup2)?;
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|_| LoopbackError::NoCgroup2)?;
    let dir = roots.unified_dir_of(&own).ok_or(LoopbackError::NoCgroup2)?;
    close(&dir, qemu_uid)
}

/// What a hook is given (`struct bpf_sock_addr`): the offsets the programs read.
const USER_IP4: i16 = 4;
const USER_IP6: i16 = 8;
const USER_PORT: i16 = 24;
/// Port 53 as the kernel stores it (network order, in the low 16 bits of a little-endian load).
const DNS_PORT: i32 = 53u16.to_be() as i32;

const HOOKS: [(&str, libbpf_sys::bpf_attach_type, bool); 4] = [
    ("connect4", libbpf_sys::BPF_CGROUP_INET4_CONNECT, false),
    ("sendmsg4", libbpf_sys::BPF_CGROUP_UDP4_SENDMSG, false),
    ("connect6", libbpf_sys::BPF_CGROUP_INET6_CONNECT, true),
    ("sendmsg6", libbpf_sys::BPF_CGROUP_UDP6_SENDMSG, true),
];

/// Closes the loopback to `qemu_uid` for the processes of `cgroup` (a directory of the cgroup v2
/// hierarchy) and its descendants.
pub(crate) fn close(cgroup: &Path, qemu_uid: u32) -> Result<LoopbackClosed, LoopbackError> {
    if qemu_uid == 0 {
        return Err(LoopbackError::RootQemu);
    }
    let dir = std::fs::File::open(cgroup).map_err(|source| LoopbackError::OpenCgroup {
        path: cgroup.into(),
        source,
    })?;
    let mut links = Vec::new();
    for (hook, attach_type, ipv6) in HOOKS {
        let program = load(hook, attach_type, &program(qemu_uid, ipv6))?;
        // SAFETY: plain FFI with valid fds; a null options pointer is allowed.
        let link = unsafe {
            libbpf_sys::bpf_link_create(
                program.as_raw_fd(),
                dir.as_raw_fd(),
                attach_type,
                std::ptr::null(),
            )
        };
        if link < 0 {
            return Err(LoopbackError::Attach {
                hook,
                path: cgroup.into(),
                source: std::io::Error::from_raw_os_error(-link),
            });
        }
        // SAFETY: a new fd, ours alone. The program stays loaded through the link.
        links.push(unsafe { OwnedFd::from_raw_fd(link) });
    }
    Ok(LoopbackClosed {
        _links: links,
        cgroup: cgroup.into(),
    })
}

fn load(
    hook: &'static str,
    attach_type: libbpf_sys::bpf_attach_type,
    insns: &[Insn],
) -> Result<OwnedFd, LoopbackError> {
    let name = CString::new(format!("vml_{hook}")).expect("no NUL");
    let license = CString::new("GPL").expect("no NUL");
    let mut log = vec![0u8; 16 * 1024];
    let mut opts = libbpf_sys::bpf_prog_load_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_prog_load_opts>() as _,
        expected_attach_type: attach_type,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr().cast(),
        ..Default::default()
    };
    // SAFETY: `Insn` has `bpf_insn`'s layout (8 bytes, C order); every pointer outlives the call.
    let fd = unsafe {
        libbpf_sys::bpf_prog_load(
            libbpf_sys::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            name.as_ptr(),
            license.as_ptr(),
            insns.as_ptr().cast(),
            insns.len() as _,
            &mut opts,
        )
    };
    if fd < 0 {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        return Err(LoopbackError::Load {
            hook,
            source: std::io::Error::from_raw_os_error(-fd),
            log: String::from_utf8_lossy(&log[..end]).trim().to_string(),
        });
    }
    // SAFETY: a new fd, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One eBPF instruction, laid out as the kernel's `struct bpf_insn`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

// The few opcodes the programs use (linux/bpf.h).
const MOV64_REG: u8 = 0xbf;
const MOV64_IMM: u8 = 0xb7;
const AND32_IMM: u8 = 0x54;
const AND64_IMM: u8 = 0x57;
const LOAD32: u8 = 0x61;
// 32-bit compares (BPF_JMP32): an immediate is sign-extended for a 64-bit compare, so
// 0xffff0000 would never equal a zero-extended 32-bit load.
const JEQ_IMM: u8 = 0x16;
const JNE_IMM: u8 = 0x56;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const GET_CURRENT_UID_GID: i32 = 15;

/// The program: allow (1) unless the caller is `uid` and the destination is a loopback address
/// on a port other than 53 (0: refused, EPERM). IPv6 loopback is `::1` and `::ffff:127.0.0.0/104`.
fn program(uid: u32, ipv6: bool) -> Vec<Insn> {
    // r6 = ctx; r0 = uid of the caller.
    let mut p = vec![
        insn(MOV64_REG, 6, 1, 0, 0),
        insn(CALL, 0, 0, 0, GET_CURRENT_UID_GID),
        insn(AND32_IMM, 0, 0, 0, -1),
        // Placeholder: if r0 != uid goto allow (patched below).
        insn(JNE_IMM, 0, 0, 0, uid as i32),
        insn(LOAD32, 2, 6, USER_PORT, 0),
        // Placeholder: if port == 53 goto allow.
        insn(JEQ_IMM, 2, 0, 0, DNS_PORT),
    ];
    // Each test leaves the program at `allow` (placeholder jumps) when the address is not a
    // loopback one, and falls through to `deny` when it is.
    let mut to_allow: Vec<usize> = vec![3, 5];
    if ipv6 {
        // Words of the address as loaded little-endian: ::1 is 0, 0, 0, 0x01000000;
        // ::ffff:127.x.y.z is 0, 0, 0xffff0000, then 127 in the low byte.
        p.push(insn(LOAD32, 2, 6, USER_IP6, 0));
        to_allow.push(p.len());
        p.push(insn(JNE_IMM, 2, 0, 0, 0));
        p.push(insn(LOAD32, 2, 6, USER_IP6 + 4, 0));
        to_allow.push(p.len());
        p.push(insn(JNE_IMM, 2, 0, 0, 0));
        p.push(insn(LOAD32, 2, 6, USER_IP6 + 8, 0));
        // Word 2 is 0: ::1 or nothing of ours.
        let mapped_at = p.len();
        p.push(insn(JNE_IMM, 2, 0, 0, 0));
        p.push(insn(LOAD32, 2, 6, USER_IP6 + 12, 0));
        to_allow.push(p.len());
        p.push(insn(JNE_IMM, 2, 0, 0, 0x0100_0000));
        let deny_jump = p.len();
        p.push(insn(0x05, 0, 0, 0, 0)); // goto deny (patched)
                                        // Word 2 is not 0: ::ffff:a.b.c.d?
        let mapped = p.len();
        p[mapped_at].off = (mapped - mapped_at - 1) as i16;
        to_allow.push(p.len());
        p.push(insn(JNE_IMM, 2, 0, 0, 0xffff_0000_u32 as i32));
        p.push(insn(LOAD32, 2, 6, USER_IP6 + 12, 0));
        p.push(insn(AND64_IMM, 2, 0, 0, 0xff));
        to_allow.push(p.len());
        p.push(insn(JNE_IMM, 2, 0, 0, 127));
        let deny = p.len();
        p[deny_jump].off = (deny - deny_jump - 1) as i16;
    } else {
        p.push(insn(LOAD32, 2, 6, USER_IP4, 0));
        p.push(insn(AND64_IMM, 2, 0, 0, 0xff));
        to_allow.push(p.len());
        p.push(insn(JNE_IMM, 2, 0, 0, 127));
    }
    // deny:
    p.push(insn(MOV64_IMM, 0, 0, 0, 0));
    p.push(insn(EXIT, 0, 0, 0, 0));
    // allow:
    let allow = p.len();
    p.push(insn(MOV64_IMM, 0, 0, 0, 1));
    p.push(insn(EXIT, 0, 0, 0, 0));
    for at in to_allow {
        p[at].off = (allow - at - 1) as i16;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    const QEMU_UID: u32 = 3_999_998;

    /// Python that sends to `addr` (TCP connect, or one UDP datagram) and exits 1 when the
    /// kernel refuses it with EPERM, 0 otherwise.
    const PROBE: &str = r#"
import errno, socket, sys
kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
try:
    if kind == "tcp":
        socket.create_connection((host, port), timeout=5).close()
    else:
        socket.socket(family, socket.SOCK_DGRAM).sendto(b"x", (host, port))
except PermissionError:
    sys.exit(1)
except OSError:
    pass
sys.exit(0)
"#;

    /// Runs the probe in a fresh cgroup v2 with the rule for `QEMU_UID` attached, as `as_uid`.
    fn refused(as_uid: u32, kind: &str, host: &str, port: u16) -> bool {
        let roots = crate::host::cgroup::CgroupRoots::detect().unwrap();
        let unified = roots
            .unified
            .expect("a cgroup v2 hierarchy (this host mounts one)");
        let dir = unified
            .dir_of(&format!(
                "/vmltest-loopback-{}-{kind}-{port}-{as_uid}",
                std::process::id()
            ))
            .unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        let closed = close(&dir, QEMU_UID).expect("the rule loads and attaches");
        let procs = CString::new(
            dir.join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        let mut probe = std::process::Command::new("python3");
        probe.args(["-c", PROBE, kind, host, &port.to_string()]);
        // SAFETY: raw system calls only, on memory prepared before the fork. Into the cgroup
        // first (as root), then the user.
        unsafe {
            probe.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                if libc::setgid(as_uid) != 0 || libc::setuid(as_uid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let status = probe.status().expect("python3");
        drop(closed);
        std::fs::remove_dir(&dir).unwrap();
        match status.code() {
            Some(1) => true,
            Some(0) => false,
            other => panic!("probe: {other:?}"),
        }
    }

    #[test]
    fn qemus_user_cannot_reach_the_loopback_and_everyone_else_can() {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = v4.local_addr().unwrap().port();
        assert!(
            refused(QEMU_UID, "tcp", "127.0.0.1", port),
            "QEMU's user, 127.0.0.1"
        );
        assert!(
            refused(QEMU_UID, "tcp", "127.1.2.3", port),
            "QEMU's user, 127/8"
        );
        assert!(
            refused(QEMU_UID, "tcp", "::ffff:127.0.0.1", port),
            "QEMU's user, v4-mapped"
        );
        assert!(refused(QEMU_UID, "tcp", "::1", port), "QEMU's user, ::1");
        assert!(refused(QEMU_UID, "udp", "127.0.0.1", 9), "QEMU's user, UDP");
        assert!(!refused(QEMU_UID, "udp", "127.0.0.1", 53), "DNS stays open");
        assert!(
            !refused(3_999_997, "tcp", "127.0.0.1", port),
            "another user"
        );
        assert!(!refused(QEMU_UID, "udp", "10.0.2.2", 9), "not the loopback");
    }

    #[test]
    fn a_pod_closes_unless_the_vmi_asks_a_host_run_opens_unless_told() {
        use GuestLoopback::*;
        let none = std::collections::BTreeMap::new();
        let asks: std::collections::BTreeMap<String, String> =
            [(OPEN_ANNOTATION.to_string(), "true".to_string())].into();
        assert_eq!(GuestLoopback::decide(None, true, &none), Closed);
        assert_eq!(GuestLoopback::decide(None, true, &asks), Open);
        assert_eq!(GuestLoopback::decide(None, false, &none), Open);
        assert_eq!(GuestLoopback::decide(Some(Closed), false, &asks), Closed);
        assert_eq!(GuestLoopback::decide(Some(Open), true, &none), Open);
    }

    #[test]
    fn a_root_qemu_is_refused() {
        assert!(matches!(
            close(Path::new("/"), 0),
            Err(LoopbackError::RootQemu)
        ));
    }
}

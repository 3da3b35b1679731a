//! Checks of single values that several areas share (names, serials, MACs, UUIDs, base64), each
//! returning a typed error that carries the value.

/// QEMU 7.2 silently truncates scsi serials past this length (newer QEMU refuses to start).
pub(crate) const MAX_SCSI_SERIAL_LEN: usize = 36;
/// Linux reports at most 20 bytes of a virtio-blk serial.
pub(crate) const MAX_VIRTIO_SERIAL_LEN: usize = 20;
/// An ATA serial number is 20 bytes (QEMU's ide-hd refuses longer ones).
pub(crate) const MAX_SATA_SERIAL_LEN: usize = 20;

/// A Kubernetes name that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error(
        "{name:?} is not a DNS-1123 label (1-63 of a-z, 0-9 and '-', alphanumeric at both ends)"
    )]
    NotALabel { name: String },
    #[error("{name:?} is not a DNS-1123 subdomain (dot-separated labels of a-z, 0-9 and '-')")]
    NotASubdomain { name: String },
    #[error("{name:?} looks like a path; volume names may not contain '/' or '..'")]
    PathLike { name: String },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SerialError {
    #[error("is empty")]
    Empty,
    #[error("{serial:?} contains {bad:?}; serials may only use A-Z a-z 0-9 _ . + -")]
    BadCharacter { serial: String, bad: char },
    #[error("{len} characters, at most {max} on bus {bus}")]
    TooLong { len: usize, max: usize, bus: String },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    #[error("{mac:?} is not a MAC address (xx:xx:xx:xx:xx:xx)")]
    Malformed { mac: String },
    #[error("{mac:?} is a multicast address")]
    Multicast { mac: String },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Base64Error {
    #[error("not base64: contains {0:?}")]
    BadCharacter(char),
    #[error("not base64: data after '='")]
    DataAfterPadding,
}

/// `8-4-4-4-12` hex digits.
pub(crate) fn looks_like_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether `value` is non-empty and only of ASCII letters, digits and the bytes in `also`: the
/// names handed on to libvirt and QEMU as they are (CPU models and features, time zones) are
/// held to their own such alphabet.
pub(crate) fn is_word(value: &str, also: &[u8]) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || also.contains(&b))
}

/// Kubernetes names: at most 63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub(crate) fn check_dns1123_label(name: &str) -> Result<(), NameError> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_ends = name
        .bytes()
        .next()
        .zip(name.bytes().last())
        .is_some_and(|(a, z)| a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric());
    if name.is_empty() || name.len() > 63 || !ok_chars || !ok_ends {
        return Err(NameError::NotALabel { name: name.into() });
    }
    Ok(())
}

/// Object names such as claims: dot-separated DNS-1123 labels, at most 253 characters.
pub(crate) fn check_dns1123_subdomain(name: &str) -> Result<(), NameError> {
    if name.is_empty()
        || name.len() > 253
        || name.split('.').any(|l| check_dns1123_label(l).is_err())
    {
        return Err(NameError::NotASubdomain { name: name.into() });
    }
    Ok(())
}

/// Volume names become libvirt aliases (`ua-<name>`) and file names in the hotplug directory,
/// so they must be DNS-1123 labels: never `/`, `..` or anything path-like.
pub(crate) fn check_volume_name(name: &str) -> Result<(), NameError> {
    if name.contains('/') || name.contains("..") {
        return Err(NameError::PathLike { name: name.into() });
    }
    check_dns1123_label(name)
}

/// Serials keep their case; only `[A-Za-z0-9_.+-]` reaches the guest unchanged.
pub(crate) fn check_serial(serial: &str, bus: &str, max: usize) -> Result<(), SerialError> {
    if serial.is_empty() {
        return Err(SerialError::Empty);
    }
    if let Some(bad) = serial
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-')))
    {
        return Err(SerialError::BadCharacter {
            serial: serial.into(),
            bad,
        });
    }
    if serial.len() > max {
        return Err(SerialError::TooLong {
            len: serial.len(),
            max,
            bus: bus.into(),
        });
    }
    Ok(())
}

/// A unicast MAC address, `xx:xx:xx:xx:xx:xx` (or with `-`).
pub(crate) fn check_mac(mac: &str) -> Result<(), MacError> {
    let octets: Vec<&str> = mac.split([':', '-']).collect();
    let hex = octets.len() == 6
        && octets
            .iter()
            .all(|o| o.len() == 2 && o.bytes().all(|b| b.is_ascii_hexdigit()));
    if !hex {
        return Err(MacError::Malformed { mac: mac.into() });
    }
    let first = u8::from_str_radix(octets[0], 16).expect("checked hex");
    if first & 1 == 1 {
        return Err(MacError::Multicast { mac: mac.into() });
    }
    Ok(())
}

/// Standard base64 (RFC 4648, padding optional, whitespace ignored), as Kubernetes writes it.
pub(crate) fn decode_base64(text: &str) -> Result<Vec<u8>, Base64Error> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    let mut padding = false;
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace()) {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                padding = true;
                continue;
            }
            other => return Err(Base64Error::BadCharacter(char::from(other))),
        };
        if padding {
            return Err(Base64Error::DataAfterPadding);
        }
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes() {
        assert_eq!(decode_base64("aGVsbG8gd29ybGQ=").unwrap(), b"hello world");
        assert_eq!(decode_base64("aGk\n").unwrap(), b"hi");
        assert!(decode_base64("a=b").is_err());
    }

    #[test]
    fn base64_names_the_bad_character() {
        assert_eq!(decode_base64("!!"), Err(Base64Error::BadCharacter('!')));
        assert_eq!(
            decode_base64("aGk=aGk="),
            Err(Base64Error::DataAfterPadding)
        );
        assert_eq!(decode_base64(""), Ok(vec![]));
    }

    #[test]
    fn dns1123_labels() {
        for good in ["a", "vm-1", "0abc", &"a".repeat(63)] {
            assert_eq!(check_dns1123_label(good), Ok(()), "{good:?}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert_eq!(
                check_dns1123_label(bad),
                Err(NameError::NotALabel { name: bad.into() }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn dns1123_subdomains_are_dotted_labels() {
        assert_eq!(check_dns1123_subdomain("claim.ns-1.x"), Ok(()));
        for bad in ["", "a..b", ".a", "A.b", &"a.".repeat(127)] {
            assert!(check_dns1123_subdomain(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn volume_names_that_look_like_paths_say_so() {
        assert_eq!(
            check_volume_name("../etc"),
            Err(NameError::PathLike {
                name: "../etc".into()
            })
        );
        assert_eq!(
            check_volume_name("a/b"),
            Err(NameError::PathLike { name: "a/b".into() })
        );
        assert_eq!(
            check_volume_name("Data"),
            Err(NameError::NotALabel {
                name: "Data".into()
            })
        );
        assert_eq!(check_volume_name("data-1"), Ok(()));
    }

    #[test]
    fn serials() {
        assert_eq!(check_serial("Ab_.+-9", "scsi", 36), Ok(()));
        assert_eq!(check_serial("", "scsi", 36), Err(SerialError::Empty));
        assert_eq!(
            check_serial("a b", "scsi", 36),
            Err(SerialError::BadCharacter {
                serial: "a b".into(),
                bad: ' '
            })
        );
        assert_eq!(
            check_serial(&"A".repeat(21), "sata", MAX_SATA_SERIAL_LEN),
            Err(SerialError::TooLong {
                len: 21,
                max: 20,
                bus: "sata".into()
            })
        );
        assert_eq!(
            check_serial(&"A".repeat(20), "virtio", MAX_VIRTIO_SERIAL_LEN),
            Ok(())
        );
    }

    #[test]
    fn macs() {
        assert_eq!(check_mac("02:00:00:00:00:01"), Ok(()));
        assert_eq!(check_mac("02-00-00-00-00-0a"), Ok(()));
        assert_eq!(
            check_mac("01:00:00:00:00:01"),
            Err(MacError::Multicast {
                mac: "01:00:00:00:00:01".into()
            })
        );
        for bad in ["", "02:00:00:00:00", "02:00:00:00:00:0g", "0200.0000.0001"] {
            assert_eq!(
                check_mac(bad),
                Err(MacError::Malformed { mac: bad.into() }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn host_paths_stay_out_of_secrets_and_the_launchers_places() {
        let denied = |path: &str, disk| match check_host_path(path, disk) {
            Err(HostPathError::Denied { dir, place, .. }) => Some((dir, place)),
            Ok(()) => None,
            Err(e) => panic!("{path}: {e}"),
        };
        let token = "/var/run/secrets/kubernetes.io/serviceaccount/token";
        for disk in [true, false] {
            assert_eq!(
                denied(token, disk),
                Some(("/var/run/secrets".into(), Place::Secrets))
            );
            assert_eq!(
                denied("/run/vmlauncher/last-sync.1.json", disk),
                Some(("/run/vmlauncher".into(), Place::Launcher))
            );
            assert_eq!(
                denied("/var/lib/etcd/member/snap/db", disk),
                Some(("/var/lib/etcd".into(), Place::Secrets))
            );
        }
        // Programs are kept out of disks only; the test guest's cache dir is not the launcher's.
        assert_eq!(denied("/usr/lib/x.img", false), None);
        assert_eq!(
            denied("/usr/lib/x.img", true),
            Some(("/usr".into(), Place::Programs))
        );
        assert_eq!(
            denied("/var/cache/vmlauncher/test-guest/vmlinuz", false),
            None
        );
        // A prefix of a name is not its directory.
        assert_eq!(denied("/var/lib/kubelet-data/d.img", true), None);
        let err = check_host_path(token, true).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{token:?} is under /var/run/secrets, where secrets are kept (tokens, the kubelet's volumes, etcd)")
        );
    }

    #[test]
    fn uuids() {
        assert!(looks_like_uuid("6a1c2f0e-8a57-4f4e-9d43-0c1e54a1b2c3"));
        assert!(!looks_like_uuid("6a1c2f0e-8a57-4f4e-9d43-0c1e54a1b2c"));
        assert!(!looks_like_uuid("6a1c2f0e8a574f4e9d430c1e54a1b2c3"));
        assert!(!looks_like_uuid("ga1c2f0e-8a57-4f4e-9d43-0c1e54a1b2c3"));
    }
}

/// What a place a spec may not point into is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The kernel's and the host's configuration.
    System,
    /// The host's programs and boot files.
    Programs,
    /// Secrets: service-account tokens, the kubelet's volumes (every pod's secrets), etcd.
    Secrets,
    /// The launcher's own state: its runtime dir (saved Sync, records, libvirt's state and the
    /// vTPM's), its private dir, the hotplug dir, QEMU's capability cache.
    Launcher,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Place::System => "the host's own files (the launcher acts as root)",
            Place::Programs => "the host's programs (the launcher acts as root)",
            Place::Secrets => "where secrets are kept (tokens, the kubelet's volumes, etcd)",
            Place::Launcher => "the launcher's own state",
        })
    }
}

/// Why a host path from a spec is refused: the launcher opens and creates it as root, and QEMU
/// gives the guest what is there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostPathError {
    #[error("{path:?} has a \"..\" component")]
    Parent { path: String },
    #[error("{path:?} is under {dir}, {place}")]
    Denied {
        path: String,
        dir: String,
        place: Place,
    },
    /// Found once links are followed: the text names an allowed place, the file is elsewhere.
    #[error("{path:?} leads to {resolved:?}, under {dir}, {place}")]
    LeadsInto {
        path: String,
        resolved: String,
        dir: String,
        place: Place,
    },
    #[error("{path:?} goes through {link:?}, a link that leads nowhere")]
    DanglingLink { path: String, link: String },
    #[error("{path:?} (as resolved: {resolved:?}) is not under a host disk root of this launcher ({roots})")]
    OutsideRoots {
        path: String,
        resolved: String,
        roots: String,
    },
    /// QEMU runs as an unprivileged user, which cannot pass through a directory on the way.
    #[error("{path:?}: QEMU's user {user} cannot reach it: {dir} is {mode:04o} {owner}:{group} (give others search permission, o+x, or run with --qemu-user root)")]
    Unreachable {
        path: String,
        user: String,
        dir: String,
        mode: u32,
        owner: u32,
        group: u32,
    },
    /// libvirt keeps a persistent TPM's state by the domain's UUID, in a directory of the
    /// libvirtd's own: a shared libvirtd keeps it after the VM is gone, for whichever spec
    /// names that UUID next.
    #[error("a persistent TPM needs the launcher's own libvirtd: the shared one (--connect) keeps its state by the domain's UUID, which another VM's spec may claim")]
    TpmStateShared,
}

/// Where no spec may point: the kernel's and the host's configuration and secrets.
pub(crate) const SYSTEM_DIRS: &[&str] = &["/proc", "/sys", "/dev", "/etc", "/root"];
/// Where no disk image belongs either: the host's programs and boot files.
pub(crate) const PROGRAM_DIRS: &[&str] = &["/boot", "/bin", "/sbin", "/lib", "/lib64", "/usr"];
/// Secrets a pod or a node keeps: a guest given one as a disk or an initrd reads it.
pub(crate) const SECRET_DIRS: &[&str] = &[
    "/run/secrets",
    "/var/run/secrets",
    "/var/lib/kubelet",
    "/var/lib/etcd",
];
/// The launcher's own places where their defaults put them (in a pod, and the default runtime
/// dir and cache of a host run); the places a launcher actually uses are checked again, resolved,
/// when it starts a VM (`host::confine`).
pub(crate) const LAUNCHER_DIRS: &[&str] = &[
    "/run/vmlauncher",
    "/var/run/vmlauncher",
    "/var/cache/vmlauncher/qemu-capabilities",
    "/run/kubevirt/hotplug-disks",
    "/var/run/kubevirt/hotplug-disks",
    "/run/kubevirt-private/vmlauncher",
    "/var/run/kubevirt-private/vmlauncher",
];

/// The places no host path from a spec may be under; `disk` adds the host's programs (a kernel
/// or an initrd is only read, a disk is written too).
pub(crate) fn denied_places(disk: bool) -> impl Iterator<Item = (&'static str, Place)> {
    let of = |dirs: &'static [&'static str], place| dirs.iter().map(move |d| (*d, place));
    of(SYSTEM_DIRS, Place::System)
        .chain(of(if disk { PROGRAM_DIRS } else { &[] }, Place::Programs))
        .chain(of(SECRET_DIRS, Place::Secrets))
        .chain(of(LAUNCHER_DIRS, Place::Launcher))
}

/// An absolute host path, as written, that stays out of [`denied_places`].
pub(crate) fn check_host_path(path: &str, disk: bool) -> Result<(), HostPathError> {
    let p = std::path::Path::new(path);
    if p.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(HostPathError::Parent { path: path.into() });
    }
    match denied_places(disk).find(|(dir, _)| p.starts_with(dir)) {
        Some((dir, place)) => Err(HostPathError::Denied {
            path: path.into(),
            dir: dir.into(),
            place,
        }),
        None => Ok(()),
    }
}

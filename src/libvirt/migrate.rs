//! Live migration through libvirt: peer to peer, the source's libvirtd talking to the target's
//! (`virDomainMigrateToURI3`), the guest's memory and copied disks over the target's unix sockets.

use virt::domain::{Domain, MigrateParameters};
use virt::sys;

use super::{Hypervisor, LibvirtError};

/// Where and how a guest goes.
#[derive(Debug, Clone, Default)]
pub(crate) struct MigrateTo {
    /// The target's libvirt (`qemu+unix:///system?socket=...`).
    pub libvirt_uri: String,
    /// Where the target's QEMU takes the memory stream (`unix:///...`).
    pub migration_uri: String,
    /// Where the target's QEMU serves its copies of the disks (`unix:///...`).
    pub disks_uri: String,
    /// The address the target's QEMU listens on, over TCP (`None`: libvirt's default).
    pub listen_address: Option<String>,
    /// The domain as the target defines it (the source's migratable XML, its paths the
    /// target's).
    pub dest_xml: String,
    /// Target names (`sda`, `vdb`) of the disks whose content is copied: those in the source's
    /// runtime dir. The others are shared (the same file on both sides).
    pub copy_disks: Vec<String>,
    /// MiB/s; `None`: libvirt's default (no limit for a p2p migration).
    pub bandwidth_mib: Option<u64>,
    /// Between machines: QEMU's memory and disk streams under TLS (`VIR_MIGRATE_TLS`, the
    /// certificates of `migrate_tls_x509_cert_dir` on both sides).
    pub tls: bool,
}

/// How far the migration in flight is: libvirt's job statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobProgress {
    pub data_total: u64,
    pub data_processed: u64,
    pub data_remaining: u64,
    /// Milliseconds the guest was paused at switch-over (the completed job's).
    pub downtime_ms: Option<u64>,
}

/// Every migration's flags (`NON_SHARED_INC` is added when disks are copied).
/// UNSAFE: libvirt takes a disk it does not copy for shared only on a network filesystem or with
/// cache=none; the launcher knows better: the disks it does not copy (host disks, claims,
/// hot-plugged files) are the same file on both sides by contract (a claim mounted in both pods,
/// a path on both hosts), and QEMU flushes them before the target opens them.
pub const MIGRATE_FLAGS: u32 = sys::VIR_MIGRATE_LIVE
    | sys::VIR_MIGRATE_PEER2PEER
    | sys::VIR_MIGRATE_PERSIST_DEST
    | sys::VIR_MIGRATE_UNDEFINE_SOURCE
    | sys::VIR_MIGRATE_UNSAFE;

/// The completed migration's statistics on `dom`, once libvirt has them, kept there for whoever
/// asks next (`virsh domjobinfo --completed`).
pub fn completed_job_of(dom: &Domain) -> Result<Option<JobProgress>, virt::error::Error> {
    let flags = sys::VIR_DOMAIN_JOB_STATS_COMPLETED | sys::VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED;
    job_stats(dom, flags)
        .map(|(kind, stats)| (kind == sys::VIR_DOMAIN_JOB_COMPLETED as i32).then_some(stats))
}

impl Hypervisor {
    /// The domain's XML as another host can define it (`VIR_DOMAIN_XML_MIGRATABLE`).
    pub(crate) fn migratable_xml(&self, name: &str) -> Result<String, LibvirtError> {
        self.on_domain(name, "get migratable XML", |dom| {
            dom.xml_desc(sys::VIR_DOMAIN_XML_MIGRATABLE | sys::VIR_DOMAIN_XML_SECURE)
        })
    }

    /// Moves the running (or paused) domain to `to`; returns once it runs there and is gone
    /// here. Blocks for the whole migration: call it off the async runtime. A paused guest
    /// stays paused (libvirt resumes only a guest that ran).
    pub(crate) fn migrate(&self, name: &str, to: &MigrateTo) -> Result<(), LibvirtError> {
        let mut flags = MIGRATE_FLAGS;
        if !to.copy_disks.is_empty() {
            // Incremental: a copied overlay's backing (a container disk's image) is on both sides.
            flags |= sys::VIR_MIGRATE_NON_SHARED_INC;
        }
        if to.tls {
            flags |= sys::VIR_MIGRATE_TLS;
        }
        let params = MigrateParameters {
            dest_xml: Some(to.dest_xml.clone()),
            uri: Some(to.migration_uri.clone()),
            disks_uri: (!to.copy_disks.is_empty()).then(|| to.disks_uri.clone()),
            migrate_disks: to.copy_disks.clone(),
            bandwidth: to.bandwidth_mib,
            listen_address: to.listen_address.clone(),
            ..MigrateParameters::default()
        };
        let dom = self.domain(name)?;
        let done = dom.migrate_to_uri3(Some(&to.libvirt_uri), params, flags);
        self.forget_domain();
        done.map_err(Self::call_err("migrate", name))
    }

    /// The migration job's progress now; `None` when no job runs.
    pub(crate) fn job_progress(&self, name: &str) -> Result<Option<JobProgress>, LibvirtError> {
        self.on_domain(name, "get job stats", |dom| job_stats(dom, 0))
            .map(|(kind, stats)| (kind != sys::VIR_DOMAIN_JOB_NONE as i32).then_some(stats))
    }

    /// The statistics of the migration that just completed ([`completed_job_of`]): on the
    /// target, where the domain stays (the source's are gone with its domain).
    pub(crate) fn completed_job(&self, name: &str) -> Result<Option<JobProgress>, LibvirtError> {
        self.on_domain(name, "get completed job stats", completed_job_of)
    }

    /// Aborts the domain's job (the migration in flight): the guest stays here.
    pub(crate) fn abort_job(&self, name: &str) -> Result<(), LibvirtError> {
        self.on_domain(name, "abort job", |dom: &Domain| {
            // SAFETY: a valid domain handle; the call takes no pointers of ours.
            let rc = unsafe { sys::virDomainAbortJob(dom.as_ptr()) };
            if rc < 0 {
                Err(virt::error::Error::last_error())
            } else {
                Ok(())
            }
        })
    }

    /// Whether libvirt keeps a definition of the domain (a migrated-in domain becomes persistent
    /// only when the migration finished).
    pub(crate) fn is_persistent(&self, name: &str) -> Result<bool, LibvirtError> {
        self.on_domain(name, "is persistent", |dom| dom.is_persistent())
    }

    /// Publishes the domain's ports now (a guest that came by migration: its source's QEMU held
    /// them until it ended).
    pub(crate) fn publish_ports(&self, name: &str) -> Result<(), LibvirtError> {
        let dom = self.domain(name)?;
        super::publish_ports(&dom, name, None)
    }
}

/// `virDomainGetJobStats`, the fields a migration's progress needs: the job's type and them.
/// Called directly: the `virt` crate's `job_stats` builds a `Vec` from the null pointer libvirt
/// returns when no job runs.
fn job_stats(dom: &Domain, flags: u32) -> Result<(i32, JobProgress), virt::error::Error> {
    let mut kind: std::os::raw::c_int = 0;
    let mut params: sys::virTypedParameterPtr = std::ptr::null_mut();
    let mut count: std::os::raw::c_int = 0;
    // SAFETY: a valid domain handle; libvirt allocates `params` (or leaves it null) and we free
    // it below.
    let rc = unsafe {
        sys::virDomainGetJobStats(dom.as_ptr(), &mut kind, &mut params, &mut count, flags)
    };
    if rc < 0 {
        return Err(virt::error::Error::last_error());
    }
    let get = |field: &std::ffi::CStr| {
        let mut value: std::os::raw::c_ulonglong = 0;
        // SAFETY: `params` holds `count` parameters (none when null); `field` is NUL-terminated.
        let found =
            unsafe { sys::virTypedParamsGetULLong(params, count, field.as_ptr(), &mut value) };
        (found == 1).then_some(value)
    };
    let stats = JobProgress {
        data_total: get(c"data_total").unwrap_or(0),
        data_processed: get(c"data_processed").unwrap_or(0),
        data_remaining: get(c"data_remaining").unwrap_or(0),
        downtime_ms: get(c"downtime"),
    };
    if !params.is_null() {
        // SAFETY: allocated by libvirt for `count` parameters, freed once.
        unsafe { sys::virTypedParamsFree(params, count) };
    }
    Ok((kind, stats))
}

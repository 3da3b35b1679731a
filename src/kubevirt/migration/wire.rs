//! What virt-handler says about a migration, read from its own encodings: the `MigrationOptions`
//! JSON of `MigrateVirtualMachine` (Go's `json.Marshal` of `cmdclient.MigrationOptions`: Go field
//! names, no tags) and the VMI's `status` (the migration's UID, its transport, a user's pause).
//! Pure: each error names the field and the value it refused.

use std::time::Duration;

use serde_json::Value;

use crate::spec::Quantity;

/// KubeVirt's `MigrationMode` for a migration that copies memory before the switch-over: the
/// only mode vmlauncher runs.
pub(crate) const PRE_COPY: &str = "PreCopy";
/// KubeVirt's `MigrationTransportUnix`: the source's libvirt and QEMU reach the target through
/// unix sockets at the same paths in both pods.
pub(crate) const UNIX_TRANSPORT: &str = "Unix";

#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    #[error("options: not a JSON object (MigrationOptions as virt-handler marshals it)")]
    OptionsShape,
    #[error("options.{field}: {value}: {why}")]
    Option {
        field: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("vmi.vmiJson: not a JSON object")]
    VmiShape,
    #[error("vmi.vmiJson: metadata.uid: empty: the migration's sockets are named by it")]
    NoUid,
    #[error("vmi.vmiJson: status.migrationState: missing: the migration is not ready")]
    NoMigrationState,
    #[error(
        "vmi.vmiJson: status.migrationTransport: {0:?}: vmlauncher takes only Unix migrations \
         (KubeVirt's legacy TCP transport is not supported)"
    )]
    Transport(String),
}

/// What of `MigrationOptions` vmlauncher honours, and what it was asked for but does not do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MigrationOptions {
    /// MiB/s; `None`: no limit (KubeVirt's `Bandwidth` of 0).
    pub bandwidth_mib: Option<u64>,
    /// `CompletionTimeoutPerGiB`: seconds allowed per GB of the guest's memory; 0 is none.
    pub completion_timeout_per_gib: u64,
    /// Options set that vmlauncher does not honour, by their Go names.
    pub not_honoured: Vec<&'static str>,
}

impl MigrationOptions {
    /// The whole migration's deadline for a guest of `memory_bytes`, as KubeVirt computes its
    /// "acceptable completion time": the per-GB timeout times the memory in GB, rounded up.
    pub(crate) fn completion_timeout(&self, memory_bytes: u64) -> Option<Duration> {
        const GB: u64 = 1_000_000_000;
        let gb = memory_bytes.div_ceil(GB).max(1);
        (self.completion_timeout_per_gib > 0)
            .then(|| Duration::from_secs(self.completion_timeout_per_gib.saturating_mul(gb)))
    }
}

/// Reads `MigrationRequest.options`. Fields vmlauncher does not know are ignored (KubeVirt adds
/// options over time); those it knows but does not honour are listed, for one warning.
pub(crate) fn migration_options(bytes: &[u8]) -> Result<MigrationOptions, WireError> {
    if bytes.is_empty() {
        return Ok(MigrationOptions::default());
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|_| WireError::OptionsShape)?;
    let object = value.as_object().ok_or(WireError::OptionsShape)?;
    let invalid = |field: &'static str, why: &'static str| WireError::Option {
        field,
        value: object[field].to_string(),
        why,
    };
    let present = |field: &str| object.get(field).filter(|v| !v.is_null());
    let bandwidth_mib = match present("Bandwidth") {
        None => None,
        Some(v) => {
            // resource.Quantity marshals as a string ("0", "64Mi"); a number is taken too.
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(invalid("Bandwidth", "not a quantity")),
            };
            let bytes = Quantity(text)
                .to_bytes()
                .map_err(|_| invalid("Bandwidth", "not a quantity (e.g. 64Mi)"))?;
            Some(bytes >> 20).filter(|&mib| mib > 0)
        }
    };
    let seconds = |field: &'static str| match present(field) {
        None => Ok(0),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| invalid(field, "not a whole number of seconds, 0 or more")),
    };
    let completion_timeout_per_gib = seconds("CompletionTimeoutPerGiB")?;
    let progress_timeout = seconds("ProgressTimeout")?;
    let is_true = |field: &str| present(field).and_then(Value::as_bool) == Some(true);
    let mut not_honoured = Vec::new();
    for (field, set) in [
        ("ProgressTimeout", progress_timeout > 0),
        (
            "MaxDowntimeMs",
            present("MaxDowntimeMs")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                > 0,
        ),
        ("AllowAutoConverge", is_true("AllowAutoConverge")),
        ("AllowPostCopy", is_true("AllowPostCopy")),
        (
            "AllowWorkloadDisruption",
            is_true("AllowWorkloadDisruption"),
        ),
        (
            "ParallelMigrationThreads",
            present("ParallelMigrationThreads").is_some(),
        ),
        (
            "Compression",
            present("Compression")
                .and_then(Value::as_str)
                .is_some_and(|c| !c.is_empty() && c != "None"),
        ),
        (
            "StallDetectorOptions",
            present("StallDetectorOptions").is_some(),
        ),
        ("DowntimeTuning", present("DowntimeTuning").is_some()),
    ] {
        if set {
            not_honoured.push(field);
        }
    }
    Ok(MigrationOptions {
        bandwidth_mib,
        completion_timeout_per_gib,
        not_honoured,
    })
}

/// What the VMI's status says about its migration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct VmiMigration {
    /// `metadata.uid`: KubeVirt names the migration's proxy sockets by it.
    pub vmi_uid: String,
    /// KubeVirt's `MigrationUID(vmi)`: `status.migrationState.sourceState.migrationUID` when
    /// there is a source state, else `status.migrationState.migrationUid`; `None` without a
    /// migration state.
    pub migration_uid: Option<String>,
    /// `status.migrationTransport`: `Unix`, or empty for KubeVirt's legacy TCP transport.
    pub transport: String,
    /// The VMI has the `Paused` condition: the guest stays paused on its target.
    pub paused: bool,
}

impl VmiMigration {
    /// The migration's UID, or why there is none yet.
    pub(crate) fn migration_uid(&self) -> Result<&str, WireError> {
        self.migration_uid
            .as_deref()
            .ok_or(WireError::NoMigrationState)
    }

    /// A target takes only what it can serve: the unix transport.
    pub(crate) fn check_transport(&self) -> Result<(), WireError> {
        if self.transport == UNIX_TRANSPORT {
            Ok(())
        } else {
            Err(WireError::Transport(self.transport.clone()))
        }
    }
}

/// Reads the migration's part of virt-handler's VMI (the same bytes the Sync reads).
pub(crate) fn vmi_migration(vmi_json: &[u8]) -> Result<VmiMigration, WireError> {
    let vmi: Value = serde_json::from_slice(vmi_json).map_err(|_| WireError::VmiShape)?;
    if !vmi.is_object() {
        return Err(WireError::VmiShape);
    }
    let text = |pointer: &str| vmi.pointer(pointer).and_then(Value::as_str);
    let vmi_uid = text("/metadata/uid").unwrap_or_default().to_string();
    if vmi_uid.is_empty() {
        return Err(WireError::NoUid);
    }
    let state = vmi
        .pointer("/status/migrationState")
        .filter(|s| s.is_object());
    let migration_uid = state.map(|s| {
        let (holder, key) = match s.get("sourceState").filter(|s| s.is_object()) {
            Some(source) => (source, "migrationUID"),
            None => (s, "migrationUid"),
        };
        holder
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    });
    let paused = vmi
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Paused")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        });
    Ok(VmiMigration {
        vmi_uid,
        migration_uid,
        transport: text("/status/migrationTransport")
            .unwrap_or_default()
            .to_string(),
        paused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What virt-handler marshals for a cluster with KubeVirt's default migration config.
    const DEFAULTS: &str = r#"{"Bandwidth":"0","ProgressTimeout":150,"CompletionTimeoutPerGiB":150,
        "MaxDowntimeMs":0,"UnsafeMigration":false,"AllowAutoConverge":false,"AllowPostCopy":false,
        "ParallelMigrationThreads":null,"AllowWorkloadDisruption":false,"StallDetectorOptions":null,
        "Compression":null,"DowntimeTuning":null}"#;

    #[test]
    fn kubevirts_defaults_map_to_no_limit_and_a_timeout() {
        let o = migration_options(DEFAULTS.as_bytes()).unwrap();
        assert_eq!(o.bandwidth_mib, None);
        assert_eq!(o.completion_timeout_per_gib, 150);
        assert_eq!(o.not_honoured, vec!["ProgressTimeout"]);
        // 256 MiB is under 1 GB: one unit; 2 GiB is 2.15 GB: three.
        assert_eq!(
            o.completion_timeout(256 << 20),
            Some(Duration::from_secs(150))
        );
        assert_eq!(
            o.completion_timeout(2 << 30),
            Some(Duration::from_secs(450))
        );
    }

    #[test]
    fn bandwidth_in_mib_and_what_is_not_honoured() {
        let o = migration_options(
            br#"{"Bandwidth":"64Mi","AllowPostCopy":true,"AllowAutoConverge":true,
                 "ParallelMigrationThreads":4,"Compression":"zstd","CompletionTimeoutPerGiB":0}"#,
        )
        .unwrap();
        assert_eq!(o.bandwidth_mib, Some(64));
        assert_eq!(o.completion_timeout(1 << 30), None);
        assert_eq!(
            o.not_honoured,
            vec![
                "AllowAutoConverge",
                "AllowPostCopy",
                "ParallelMigrationThreads",
                "Compression"
            ]
        );
        assert_eq!(migration_options(b"").unwrap(), MigrationOptions::default());
    }

    #[test]
    fn bad_options_name_the_field() {
        for (json, field) in [
            (r#"{"Bandwidth":"fast"}"#, "options.Bandwidth: \"fast\""),
            (r#"{"Bandwidth":true}"#, "options.Bandwidth: true"),
            (
                r#"{"CompletionTimeoutPerGiB":-5}"#,
                "options.CompletionTimeoutPerGiB: -5",
            ),
        ] {
            let e = migration_options(json.as_bytes()).unwrap_err().to_string();
            assert!(e.starts_with(field), "{e}");
        }
        assert!(matches!(
            migration_options(b"[1]"),
            Err(WireError::OptionsShape)
        ));
    }

    #[test]
    fn the_migration_uid_as_kubevirt_picks_it() {
        let vmi = |status: &str| {
            format!(r#"{{"metadata":{{"uid":"vmi-1"}},"status":{status}}}"#).into_bytes()
        };
        let plain = vmi_migration(&vmi(
            r#"{"migrationTransport":"Unix","migrationState":{"migrationUid":"m-1"}}"#,
        ))
        .unwrap();
        assert_eq!(plain.migration_uid().ok(), Some("m-1"));
        assert_eq!(plain.vmi_uid, "vmi-1");
        assert!(plain.check_transport().is_ok());
        let decentralized = vmi_migration(&vmi(
            r#"{"migrationState":{"migrationUid":"m-1","sourceState":{"migrationUID":"m-src"}}}"#,
        ))
        .unwrap();
        assert_eq!(decentralized.migration_uid().ok(), Some("m-src"));
        assert!(decentralized.check_transport().is_err());
        let none = vmi_migration(&vmi(r#"{"phase":"Running"}"#)).unwrap();
        assert!(matches!(
            none.migration_uid(),
            Err(WireError::NoMigrationState)
        ));
        let paused = vmi_migration(&vmi(
            r#"{"conditions":[{"type":"Paused","status":"True"}]}"#,
        ))
        .unwrap();
        assert!(paused.paused);
        assert!(matches!(
            vmi_migration(br#"{"metadata":{}}"#),
            Err(WireError::NoUid)
        ));
    }
}

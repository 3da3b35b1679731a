//! `vmlauncher migrate`: moves the VM of one launcher to another (started with `run --incoming`),
//! showing progress on standard error once a second; or cancels the migration in flight.

use std::path::Path;
use std::time::Duration;

use super::exit::MainError;
use vmlauncher::api::{self, proto};
use vmlauncher::ended::Ended;
use vmlauncher::migration_tls::MigrationTls;

use super::args::Output;
use super::client::{answer, connect};
use super::output::migration_json;
use super::{outln, Outcome};

pub(crate) struct MigrateArgs<'a> {
    pub socket: &'a Path,
    /// A socket path, or `HOST:PORT` for a target on another machine.
    pub to: &'a str,
    /// Credentials to read the target's end over TCP (`--tls-dir`).
    pub tls_dir: Option<&'a Path>,
    pub timeout: u32,
    pub bandwidth: u64,
    pub output: Output,
}

pub(crate) async fn migrate(args: MigrateArgs<'_>) -> Outcome {
    // Unusable credentials are said before the migration starts, not after it.
    let tls = args
        .tls_dir
        .map(MigrationTls::read)
        .transpose()
        .map_err(MainError::MigrationTls)?;
    let mut client = connect(args.socket).await?;
    // Progress comes from the source's own event stream, on a second connection.
    let progress = tokio::spawn(show_progress(args.socket.to_path_buf()));
    // The target's end, followed from before the migration: a target on TCP closes its port
    // once its migration is over, and serves on only the connections it has.
    let target_end = tokio::spawn(target_done(args.to.to_string(), tls.clone()));
    let reply = client
        .migrate(proto::MigrateRequest {
            target: args.to.into(),
            timeout_seconds: args.timeout,
            bandwidth_mib: args.bandwidth,
        })
        .await;
    progress.abort();
    let reply = answer(reply)?;
    let m = reply.migration.unwrap_or_default();
    // The guest's pause at switch-over is the target's to tell: the source's domain, and its
    // job's statistics, are gone.
    let arrived = tokio::time::timeout(TARGET_DONE, target_end)
        .await
        .ok()
        .and_then(Result::ok)
        .flatten();
    match args.output {
        Output::Json => outln!(
            "{}",
            serde_json::json!({"taskId": reply.task_id, "migration": migration_json(&m),
                "target": arrived.as_ref().map(migration_json)})
        ),
        Output::Text => outln!(
            "migrated to {} in {:.2}s ({} MiB sent; guest paused {} at switch-over)",
            args.to,
            m.elapsed_ms as f64 / 1000.0,
            m.data_processed >> 20,
            arrived.filter(|a| a.state == "Completed").map_or(
                "for an unknown time".into(),
                |a| format!("{} ms", a.downtime_ms)
            )
        ),
    }
    Ok(Ended::Done)
}

pub(crate) async fn cancel(socket: &Path, output: Output) -> Outcome {
    let mut client = connect(socket).await?;
    let reply = answer(client.cancel_migration(proto::CommandRequest {}).await)?;
    match output {
        Output::Json => outln!("{}", serde_json::json!({"taskId": reply.task_id})),
        Output::Text => outln!("cancelling the migration (task {})", reply.task_id),
    }
    Ok(Ended::Done)
}

/// How long the target may take to finish its side after the source's ended.
const TARGET_DONE: Duration = Duration::from_secs(15);

/// The target's migration status once its side ended too (it has the statistics). Over TCP
/// only with credentials to reach it.
async fn target_done(target: String, tls: Option<MigrationTls>) -> Option<proto::MigrationStatus> {
    use proto::event::Kind;
    let mut client = match api::tcp::TcpTarget::parse(&target) {
        Some(tcp) => api::tcp::connect(&tcp, tls.as_ref()?).await.ok()?,
        None => api::connect(Path::new(&target)).await.ok()?,
    };
    let mut stream = client
        .watch_events(proto::WatchEventsRequest {})
        .await
        .ok()?
        .into_inner();
    while let Ok(Some(event)) = stream.message().await {
        if let Some(Kind::Status(s) | Kind::Resync(s)) = event.kind {
            // Followed from before the migration: its first states are not the end.
            let over = |m: &proto::MigrationStatus| {
                matches!(m.state.as_str(), "Completed" | "Failed" | "Cancelled")
            };
            if let Some(m) = s.migration.filter(over) {
                return Some(m);
            }
        }
    }
    None
}

/// One line a second while the guest's memory and disks are on their way.
async fn show_progress(socket: std::path::PathBuf) {
    use proto::event::Kind;
    let Ok(mut client) = api::connect(&socket).await else {
        return;
    };
    let Ok(reply) = client.watch_events(proto::WatchEventsRequest {}).await else {
        return;
    };
    let mut stream = reply.into_inner();
    let mut last: Option<tokio::time::Instant> = None;
    while let Ok(Some(event)) = stream.message().await {
        let (Some(Kind::Status(s)) | Some(Kind::Resync(s))) = event.kind else {
            continue;
        };
        let Some(m) = s
            .migration
            .filter(|m| m.state == "Migrating" && m.data_total > 0)
        else {
            continue;
        };
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            continue;
        }
        last = Some(tokio::time::Instant::now());
        eprintln!(
            "vmlauncher: migrating: {} of {} MiB sent, {} MiB left ({:.1}s)",
            m.data_processed >> 20,
            m.data_total >> 20,
            m.data_remaining >> 20,
            m.elapsed_ms as f64 / 1000.0
        );
    }
}

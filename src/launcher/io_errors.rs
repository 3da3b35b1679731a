//! Disk I/O errors, reported at a bounded rate. With `errorPolicy: report` or `ignore` the guest
//! keeps running after an error and may cause thousands a second; each one reported (a log line,
//! an event on the stream, a state read) would flood the log and the stream. The
//! first error is reported at once; those that follow within [`REPORT_INTERVAL`] are counted,
//! and reported together, by the latest one, when the interval is over.

use std::time::{Duration, Instant};

/// At most one report of I/O errors per this interval.
pub(super) const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// An I/O error to report, and how many more came since the last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct IoErrorReport {
    pub message: String,
    pub suppressed: u64,
}

impl IoErrorReport {
    /// The event's detail: the error, and the count of those folded into it.
    pub(crate) fn detail(&self) -> String {
        match self.suppressed {
            0 => self.message.clone(),
            n => format!("{} ({n} more since the last report)", self.message),
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct IoErrorReports {
    last_report: Option<Instant>,
    /// Errors since the last report, and the latest of them.
    suppressed: u64,
    latest: Option<String>,
}

impl IoErrorReports {
    /// One more error: the report to make now, if one is due.
    pub(crate) fn record(&mut self, message: String, now: Instant) -> Option<IoErrorReport> {
        let quiet = self
            .last_report
            .is_none_or(|t| now.duration_since(t) >= REPORT_INTERVAL);
        if quiet {
            let suppressed = std::mem::take(&mut self.suppressed);
            self.latest = None;
            self.last_report = Some(now);
            return Some(IoErrorReport {
                message,
                suppressed,
            });
        }
        self.suppressed += 1;
        self.latest = Some(message);
        None
    }

    /// When the errors held back must be reported, if any are.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.latest.as_ref()?;
        self.last_report.map(|t| t + REPORT_INTERVAL)
    }

    /// The errors held back, as one report, once their interval is over.
    pub(crate) fn flush(&mut self, now: Instant) -> Option<IoErrorReport> {
        if self.due().is_none_or(|due| now < due) {
            return None;
        }
        let message = self.latest.take()?;
        self.last_report = Some(now);
        // The latest one is the report; the others are counted.
        let suppressed = std::mem::take(&mut self.suppressed) - 1;
        Some(IoErrorReport {
            message,
            suppressed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_is_reported_at_once_and_a_burst_once_its_interval_is_over() {
        let t0 = Instant::now();
        let mut reports = IoErrorReports::default();
        assert_eq!(
            reports.record("e0".into(), t0),
            Some(IoErrorReport {
                message: "e0".into(),
                suppressed: 0
            })
        );
        assert_eq!(reports.due(), None);
        for i in 1..=500 {
            assert_eq!(reports.record(format!("e{i}"), t0), None);
        }
        assert_eq!(reports.due(), Some(t0 + REPORT_INTERVAL));
        assert_eq!(reports.flush(t0 + REPORT_INTERVAL / 2), None);
        let flushed = reports.flush(t0 + REPORT_INTERVAL).unwrap();
        assert_eq!(flushed.detail(), "e500 (499 more since the last report)");
        assert_eq!(reports.due(), None);
        assert_eq!(reports.flush(t0 + REPORT_INTERVAL * 3), None);
        // After a quiet interval, the next error is reported at once again.
        assert!(reports
            .record("later".into(), t0 + REPORT_INTERVAL * 3)
            .is_some());
    }
}

//! Where the VM's life under this launcher stands: running (or free to run again), being
//! stopped for good by SIGTERM, or over, and how it ended. One value in the launcher's `State`
//! instead of five flags, so that "migrated away but not finished" or "lost and migrated away"
//! cannot be written; every move between the stages is a method here, and the table test
//! below is the list of legal moves.
//!
//! Two facts ride along where they mean something: `grace_expired`, whether the last graceful
//! stop ran out of its grace period and destroyed the guest (phase Failed, GracePeriodExpired,
//! while the VM stays stopped), and `terminated`, whether SIGTERM came (then nothing may start
//! the VM again, even after it is over).

/// The stage of the VM's life under this launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Life {
    /// The VM runs here, or may run again: stopped and waiting for a Start or a restart.
    Running { grace_expired: bool },
    /// SIGTERM came: the VM is being stopped for good; only Shutdown and Kill may run.
    Terminating { grace_expired: bool },
    /// The VM will not run again under this launcher: a final stop, a lost domain, or libvirt
    /// out of reach for too long. Without `terminated`, a Start call may still run it again.
    Finished {
        terminated: bool,
        grace_expired: bool,
    },
    /// The VM went to another launcher: its life here ended well (phase Succeeded, Migrated).
    MigratedAway { terminated: bool },
    /// A migration target whose incoming guest never arrived (phase Failed, MigrationFailed).
    MigrationLost { terminated: bool },
}

impl Default for Life {
    fn default() -> Self {
        Life::Running {
            grace_expired: false,
        }
    }
}

impl Life {
    /// SIGTERM came (whatever happened since): only Shutdown and Kill may run.
    pub(super) fn terminated(self) -> bool {
        match self {
            Life::Running { .. } => false,
            Life::Terminating { .. } => true,
            Life::Finished { terminated, .. }
            | Life::MigratedAway { terminated }
            | Life::MigrationLost { terminated } => terminated,
        }
    }

    /// The VM will not run again under this launcher (unless a Start call, allowed only
    /// without SIGTERM, runs it again).
    pub(super) fn is_finished(self) -> bool {
        !matches!(self, Life::Running { .. } | Life::Terminating { .. })
    }

    /// The last graceful stop ran out of its grace period and the guest was destroyed.
    pub(super) fn grace_expired(self) -> bool {
        match self {
            Life::Running { grace_expired }
            | Life::Terminating { grace_expired }
            | Life::Finished { grace_expired, .. } => grace_expired,
            Life::MigratedAway { .. } | Life::MigrationLost { .. } => false,
        }
    }

    pub(super) fn is_migrated_away(self) -> bool {
        matches!(self, Life::MigratedAway { .. })
    }

    pub(super) fn is_migration_lost(self) -> bool {
        matches!(self, Life::MigrationLost { .. })
    }

    /// How the VM's life here ended by a migration, if it did: no command but a stop may
    /// act on it any more.
    pub(super) fn migration_ended(self) -> Option<&'static str> {
        match self {
            Life::MigratedAway { .. } => Some("the VM went to another launcher by migration"),
            Life::MigrationLost { .. } => Some("the VM's incoming migration never arrived"),
            _ => None,
        }
    }

    /// The domain was (re)started here: the VM runs again, its last stop forgotten. After
    /// SIGTERM (a start then is refused before it runs) it stays terminating; a migration's
    /// end is not undone by a start here (the guest runs on the target, or never came).
    pub(super) fn started(self) -> Life {
        match self {
            Life::Running { .. }
            | Life::Finished {
                terminated: false, ..
            } => Life::default(),
            Life::Terminating { .. }
            | Life::Finished {
                terminated: true, ..
            } => Life::Terminating {
                grace_expired: false,
            },
            Life::MigratedAway { .. } | Life::MigrationLost { .. } => self,
        }
    }

    /// A graceful stop is about to destroy the guest: `grace_expired` says whether it waited
    /// out the grace period first (else the guest could not be asked, or was killed outright).
    pub(super) fn destroying(self, grace_expired: bool) -> Life {
        match self {
            Life::Running { .. } => Life::Running { grace_expired },
            Life::Terminating { .. } => Life::Terminating { grace_expired },
            Life::Finished { terminated, .. } => Life::Finished {
                terminated,
                grace_expired,
            },
            Life::MigratedAway { .. } | Life::MigrationLost { .. } => self,
        }
    }

    /// SIGTERM came.
    pub(super) fn terminate(self) -> Life {
        match self {
            Life::Running { grace_expired } | Life::Terminating { grace_expired } => {
                Life::Terminating { grace_expired }
            }
            Life::Finished { grace_expired, .. } => Life::Finished {
                terminated: true,
                grace_expired,
            },
            Life::MigratedAway { .. } => Life::MigratedAway { terminated: true },
            Life::MigrationLost { .. } => Life::MigrationLost { terminated: true },
        }
    }

    /// The VM is final here; an end already reached (a migration's) stays.
    pub(super) fn finish(self) -> Life {
        match self {
            Life::Running { grace_expired } => Life::Finished {
                terminated: false,
                grace_expired,
            },
            Life::Terminating { grace_expired } => Life::Finished {
                terminated: true,
                grace_expired,
            },
            Life::Finished { .. } | Life::MigratedAway { .. } | Life::MigrationLost { .. } => self,
        }
    }

    /// The guest left for another launcher: the end, whatever came before.
    pub(super) fn migrated_away(self) -> Life {
        Life::MigratedAway {
            terminated: self.terminated(),
        }
    }

    /// A target's incoming guest never came: the end, unless it had arrived and left again.
    pub(super) fn migration_lost(self) -> Life {
        match self {
            Life::MigratedAway { .. } => self,
            _ => Life::MigrationLost {
                terminated: self.terminated(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNNING: Life = Life::Running {
        grace_expired: false,
    };
    const RUNNING_GRACE: Life = Life::Running {
        grace_expired: true,
    };
    const TERMINATING: Life = Life::Terminating {
        grace_expired: false,
    };
    const TERMINATING_GRACE: Life = Life::Terminating {
        grace_expired: true,
    };
    const FINISHED: Life = Life::Finished {
        terminated: false,
        grace_expired: false,
    };
    const FINISHED_GRACE: Life = Life::Finished {
        terminated: false,
        grace_expired: true,
    };
    const FINISHED_TERM: Life = Life::Finished {
        terminated: true,
        grace_expired: false,
    };
    const FINISHED_TERM_GRACE: Life = Life::Finished {
        terminated: true,
        grace_expired: true,
    };
    const AWAY: Life = Life::MigratedAway { terminated: false };
    const AWAY_TERM: Life = Life::MigratedAway { terminated: true };
    const LOST: Life = Life::MigrationLost { terminated: false };
    const LOST_TERM: Life = Life::MigrationLost { terminated: true };

    const ALL: [Life; 12] = [
        RUNNING,
        RUNNING_GRACE,
        TERMINATING,
        TERMINATING_GRACE,
        FINISHED,
        FINISHED_GRACE,
        FINISHED_TERM,
        FINISHED_TERM_GRACE,
        AWAY,
        AWAY_TERM,
        LOST,
        LOST_TERM,
    ];

    type Move = fn(Life) -> Life;

    /// Every move from every stage: the rows follow `ALL`, the columns are started,
    /// destroying(true), terminate, finish, migrated_away, migration_lost.
    #[test]
    fn every_move_from_every_stage() {
        let moves: [(&str, Move); 6] = [
            ("started", Life::started),
            ("destroying(true)", |l| l.destroying(true)),
            ("terminate", Life::terminate),
            ("finish", Life::finish),
            ("migrated_away", Life::migrated_away),
            ("migration_lost", Life::migration_lost),
        ];
        #[rustfmt::skip]
        let table: [[Life; 6]; 12] = [
            // started     destroying       terminate          finish               away       lost
            [RUNNING,      RUNNING_GRACE,   TERMINATING,       FINISHED,            AWAY,      LOST],
            [RUNNING,      RUNNING_GRACE,   TERMINATING_GRACE, FINISHED_GRACE,      AWAY,      LOST],
            [TERMINATING,  TERMINATING_GRACE, TERMINATING,     FINISHED_TERM,       AWAY_TERM, LOST_TERM],
            [TERMINATING,  TERMINATING_GRACE, TERMINATING_GRACE, FINISHED_TERM_GRACE, AWAY_TERM, LOST_TERM],
            [RUNNING,      FINISHED_GRACE,  FINISHED_TERM,     FINISHED,            AWAY,      LOST],
            [RUNNING,      FINISHED_GRACE,  FINISHED_TERM_GRACE, FINISHED_GRACE,    AWAY,      LOST],
            [TERMINATING,  FINISHED_TERM_GRACE, FINISHED_TERM, FINISHED_TERM,       AWAY_TERM, LOST_TERM],
            [TERMINATING,  FINISHED_TERM_GRACE, FINISHED_TERM_GRACE, FINISHED_TERM_GRACE, AWAY_TERM, LOST_TERM],
            [AWAY,         AWAY,            AWAY_TERM,         AWAY,                AWAY,      AWAY],
            [AWAY_TERM,    AWAY_TERM,       AWAY_TERM,         AWAY_TERM,           AWAY_TERM, AWAY_TERM],
            [LOST,         LOST,            LOST_TERM,         LOST,                AWAY,      LOST],
            [LOST_TERM,    LOST_TERM,       LOST_TERM,         LOST_TERM,           AWAY_TERM, LOST_TERM],
        ];
        for (from, row) in ALL.iter().zip(table) {
            for ((name, step), want) in moves.iter().zip(row) {
                assert_eq!(step(*from), want, "{from:?}.{name}");
            }
        }
    }

    /// What the status and the task admission read of each stage: (terminated, finished,
    /// grace_expired, migrated away, migration lost).
    #[test]
    fn what_each_stage_reads_as() {
        let t = true;
        let f = false;
        let table = [
            (RUNNING, [f, f, f, f, f]),
            (RUNNING_GRACE, [f, f, t, f, f]),
            (TERMINATING, [t, f, f, f, f]),
            (TERMINATING_GRACE, [t, f, t, f, f]),
            (FINISHED, [f, t, f, f, f]),
            (FINISHED_GRACE, [f, t, t, f, f]),
            (FINISHED_TERM, [t, t, f, f, f]),
            (FINISHED_TERM_GRACE, [t, t, t, f, f]),
            (AWAY, [f, t, f, t, f]),
            (AWAY_TERM, [t, t, f, t, f]),
            (LOST, [f, t, f, f, t]),
            (LOST_TERM, [t, t, f, f, t]),
        ];
        for (life, want) in table {
            let got = [
                life.terminated(),
                life.is_finished(),
                life.grace_expired(),
                life.is_migrated_away(),
                life.is_migration_lost(),
            ];
            assert_eq!(got, want, "{life:?}");
        }
    }

    /// The paths the launcher takes, end to end.
    #[test]
    fn the_launchers_paths() {
        // SIGTERM, the guest destroyed after its grace period, then final.
        let l = RUNNING.terminate().destroying(true).finish();
        assert_eq!(l, FINISHED_TERM_GRACE);
        assert_eq!(
            l.started(),
            TERMINATING,
            "a start after SIGTERM does not revive"
        );
        // An owner's final stop, then a Start call: running again.
        assert_eq!(RUNNING.destroying(false).finish().started(), RUNNING);
        // A migration out, then SIGTERM: still migrated away.
        assert_eq!(RUNNING.migrated_away().terminate().finish(), AWAY_TERM);
        // A target whose guest never came.
        assert_eq!(RUNNING.migration_lost(), LOST);
    }
}

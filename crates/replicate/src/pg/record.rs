//! What the output plugins' records mean, whichever plugin decoded them, and the numbering
//! of their changes.

/// One column value in PostgreSQL's text output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// SQL NULL.
    Null,
    /// The type's text output (strings are unescaped; numbers and booleans verbatim).
    Text(String),
}

/// One decoded record of an output plugin (wal2json or pgoutput).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// A transaction starts; its transaction id when wal2json printed it.
    Begin(Option<u32>),
    /// A row change (`I`, `U`, `D`) or a `T`runcate.
    Change(RowChange),
    /// A transaction ends; the row's LSN is the end of its commit record.
    Commit,
    /// Anything else (logical messages, relation and type descriptions): takes no position.
    Other,
}

/// A row change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowChange {
    /// `I`, `U`, `D` or `T`.
    pub action: char,
    pub schema: String,
    pub table: String,
    /// The new row (inserts, updates; unchanged TOASTed columns are missing).
    pub columns: Vec<(String, Value)>,
    /// The old key (updates, deletes), or the whole old row with REPLICA IDENTITY FULL.
    pub identity: Vec<(String, Value)>,
}

impl RowChange {
    /// The named column of the new row.
    pub fn new_value(&self, name: &str) -> Option<&Value> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The named column of the old row (identity).
    pub fn old_value(&self, name: &str) -> Option<&Value> {
        self.identity
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// Whether this is an update that changed `id` (it becomes a delete of the old key and an
    /// insert of the new one, so it takes two positions). Depends on the record alone.
    pub fn moves_key(&self) -> bool {
        self.action == 'U'
            && matches!(
                (self.old_value("id"), self.new_value("id")),
                (Some(old), Some(new)) if old != new
            )
    }

    /// How many positions the record takes.
    pub fn width(&self) -> u64 {
        if self.moves_key() {
            2
        } else {
            1
        }
    }
}

/// Positions for the changes of a run of records decoded from a restart point.
///
/// `next` is the smallest position the next change may take. A change record at LSN `l`
/// taking `w` positions gets `p = max(l, next)` (and `p + 1` when `w = 2`); `next` becomes
/// `p + w`. At a commit whose end is `e`: if `next <= e`, every position handed out so far is
/// below `e` and every later record starts at or after `e`, so `next` is set to `e` and `e` is
/// a restart point: starting the numbering there (with `next = e`) gives the same positions as
/// this run. If `next > e` (interleaved transactions pushed the numbering past the commit), the
/// commit is not a restart point.
#[derive(Debug, Clone)]
pub(crate) struct Numbering {
    next: u64,
}

impl Numbering {
    /// Numbering from a restart point (the slot's `confirmed_flush_lsn`).
    pub fn new(restart: u64) -> Numbering {
        Numbering { next: restart }
    }

    /// The first of `width` positions of a change record at `lsn`.
    pub fn change(&mut self, lsn: u64, width: u64) -> u64 {
        let p = lsn.max(self.next);
        self.next = p.saturating_add(width);
        p
    }

    /// A commit ending at `end`: whether it is a restart point.
    pub fn commit(&mut self, end: u64) -> bool {
        if self.next <= end {
            self.next = end;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_follows_the_wal_and_stays_increasing() {
        // Sequential transactions: positions are the changes' LSNs.
        let mut n = Numbering::new(100);
        assert_eq!(n.change(100, 1), 100);
        assert_eq!(n.change(180, 1), 180);
        assert!(n.commit(260));
        assert_eq!(n.change(260, 1), 260);
        assert!(n.commit(400));
        // Interleaved: this transaction wrote at 120..140 but committed after 400.
        assert_eq!(n.change(120, 1), 400);
        assert_eq!(n.change(130, 2), 401);
        assert_eq!(n.change(140, 1), 403);
        assert!(n.commit(450));
        // Interleaved with many changes: the numbering passes the commit's end.
        let mut n = Numbering::new(1000);
        let ps: Vec<u64> = (0..50).map(|i| n.change(500 + i * 10, 1)).collect();
        assert!(ps.windows(2).all(|w| w[0] < w[1]));
        assert!(!n.commit(1040));
        assert_eq!(n.change(1040, 1), 1050);
        assert!(n.commit(2000));
    }

    #[test]
    fn restarting_at_a_restart_point_numbers_the_same() {
        // Records: (lsn, Some(width)) for a change, (end, None) for a commit.
        let wal: Vec<(u64, Option<u64>)> = vec![
            (10, Some(1)),
            (20, Some(2)),
            (60, None),
            (15, Some(1)),
            (16, Some(1)),
            (62, None),
            (62, Some(1)),
            (90, None),
            (70, Some(1)),
            (120, None),
        ];
        let run = |from: usize, start: u64| {
            let mut n = Numbering::new(start);
            let mut out = Vec::new();
            let mut restarts = Vec::new();
            for (i, (lsn, w)) in wal.iter().enumerate().skip(from) {
                match w {
                    Some(w) => out.push((i, n.change(*lsn, *w))),
                    None => {
                        if n.commit(*lsn) {
                            restarts.push((i + 1, *lsn));
                        }
                    }
                }
            }
            (out, restarts)
        };
        let (all, restarts) = run(0, 0);
        assert!(all.windows(2).all(|w| w[0].1 < w[1].1));
        for (from, lsn) in restarts {
            let (tail, _) = run(from, lsn);
            assert_eq!(
                &all[all.len() - tail.len()..],
                &tail[..],
                "restart at {lsn}"
            );
        }
    }
}

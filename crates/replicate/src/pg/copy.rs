//! The initial copy's pieces: the snapshot that decides which transactions the copy holds,
//! and the source-side table that remembers a copy across restarts.

/// The table in the source database that remembers, per slot, that a replica's initial copy is
/// not acknowledged yet (`pending`) and the snapshot of the first copy (`snapshot`,
/// `snapshot_lsn`): the stream leaves out transactions that snapshot sees. A slot's row goes
/// once its copy is acknowledged and the slot has moved past the snapshot.
pub const COPY_TABLE: &str = "dedupwire_copy";

/// Which transactions a snapshot sees (`pg_current_snapshot()`, as `xmin:xmax:xip,...`), by
/// 32-bit transaction id as the output plugins give them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    xmin: u32,
    xmax: u32,
    xip: Vec<u32>,
}

/// `a` is older than `b` in PostgreSQL's circular 32-bit transaction id space.
fn precedes(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

impl Snapshot {
    /// Parses `pg_snapshot` text (64-bit ids with epoch; the low 32 bits are the xid).
    pub fn parse(text: &str) -> Option<Snapshot> {
        let mut parts = text.trim().split(':');
        let id = |s: &str| s.parse::<u64>().ok().map(|v| v as u32);
        let xmin = id(parts.next()?)?;
        let xmax = id(parts.next()?)?;
        let xip = parts
            .next()?
            .split(',')
            .filter(|s| !s.is_empty())
            .map(id)
            .collect::<Option<Vec<u32>>>()?;
        if parts.next().is_some() {
            return None;
        }
        Some(Snapshot { xmin, xmax, xip })
    }

    /// Whether committed transaction `xid` had committed when the snapshot was taken (its rows
    /// are in a copy made with it).
    pub fn sees(&self, xid: u32) -> bool {
        precedes(xid, self.xmin) || (precedes(xid, self.xmax) && !self.xip.contains(&xid))
    }
}

#[cfg(test)]
mod tests {
    use super::Snapshot;

    #[test]
    fn snapshot_visibility() {
        let s = Snapshot::parse("100:105:101,103").unwrap();
        assert!(s.sees(99) && s.sees(100) && s.sees(102) && s.sees(104));
        assert!(!s.sees(101) && !s.sees(103) && !s.sees(105) && !s.sees(4000));
        let s = Snapshot::parse("4294967300:4294967302:").unwrap();
        assert!(s.sees(3) && !s.sees(6));
        assert!(s.sees(u32::MAX - 5), "just before the wrap");
        assert!(Snapshot::parse("1:2").is_none());
        assert!(Snapshot::parse("1:x:").is_none());
    }
}

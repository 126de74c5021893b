//! The router look-ahead's guard: whether reading a later layer's likely experts early is
//! paying off. A look-ahead read that its layer then uses saves that layer a wait; one it does
//! not use only takes the disk from the misses that are certain. So the cache reads ahead
//! while at least half of the recent look-ahead reads were used, and otherwise holds back,
//! still reading one look-ahead in [`PROBE_EVERY`] so that it notices when the guesses become
//! good again. The cache keeps one guard per look-ahead depth: guesses two layers ahead are
//! right less often than guesses for the next layer, and are judged on their own record.
//!
//! Measured on the Qwen3-30B-A3B shape (docs/BENCHMARKS.md): with the model's own routing 93 %
//! of look-ahead reads are used and decode is 33 % faster; with routing forced from a trace
//! (which the look-ahead cannot foresee) 4 % are used and decode was 38 % slower unguarded.
//! The guard only decides *when* records are read, never what is computed: logits are the same
//! bits either way.

/// Look-ahead reads whose use is judged together: past this many, both counts are halved, so
/// the judgement follows the recent past.
const WINDOW: u32 = 256;
/// Reads before the guard judges at all.
const WARMUP: u32 = 64;
/// While holding back, one look-ahead in this many is still read, to keep measuring.
pub(crate) const PROBE_EVERY: u64 = 32;

/// Counts of recent look-ahead reads and of those their layer used.
#[derive(Clone, Debug, Default)]
pub(crate) struct AheadGuard {
    issued: u32,
    used: u32,
    asked: u64,
}

impl AheadGuard {
    /// Whether this look-ahead (one layer's likely experts) should be read.
    pub(crate) fn should_read(&mut self) -> bool {
        self.asked += 1;
        self.issued < WARMUP || 2 * self.used >= self.issued || self.asked.is_multiple_of(PROBE_EVERY)
    }

    /// `n` records were read ahead.
    pub(crate) fn note_issued(&mut self, n: u32) {
        self.issued += n;
        if self.issued > WINDOW {
            self.issued /= 2;
            self.used /= 2;
        }
    }

    /// Look-ahead reads issued in the current window (for tests).
    #[cfg(test)]
    pub(crate) fn issued(&self) -> u32 {
        self.issued
    }

    /// A look-ahead read was taken back before it started: it cost nothing.
    pub(crate) fn note_cancelled(&mut self) {
        self.issued = self.issued.saturating_sub(1).max(self.used);
    }

    /// A record read ahead was used by its layer.
    pub(crate) fn note_used(&mut self) {
        self.used = (self.used + 1).min(self.issued);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `calls` look-aheads of 8 records, of which `used_of_8` are used when read, and
    /// returns how many were read.
    fn run(g: &mut AheadGuard, calls: u32, used_of_8: u32) -> u32 {
        let mut read = 0;
        for _ in 0..calls {
            if g.should_read() {
                read += 1;
                g.note_issued(8);
                for _ in 0..used_of_8 {
                    g.note_used();
                }
            }
        }
        read
    }

    #[test]
    fn good_guesses_are_always_read() {
        let mut g = AheadGuard::default();
        assert_eq!(run(&mut g, 1000, 7), 1000);
        assert_eq!(run(&mut g, 1000, 4), 1000, "half used is still worth it");
    }

    #[test]
    fn wrong_guesses_stop_after_the_warmup_and_probing_brings_them_back() {
        let mut g = AheadGuard::default();
        let read = run(&mut g, 3200, 0);
        // The warmup's 8 calls, then one in PROBE_EVERY.
        assert!(read <= 8 + 3200 / PROBE_EVERY as u32 + 1, "{read} read");
        assert!(read >= 3200 / PROBE_EVERY as u32, "{read} read: probes continue");
        // Guesses that turn good are noticed by the probes, then read every time again.
        run(&mut g, 3200, 8);
        assert_eq!(run(&mut g, 100, 8), 100);
    }
}

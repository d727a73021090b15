//! Output cut into lines: a command task's pipes, and the agent's own fds 1 and 2 while a
//! function task runs, go through the same splitter.

/// The longest output line passed on; longer ones are cut into pieces of this size.
pub const MAX_LINE: usize = 64 * 1024;

/// Splits bytes into lines: without their line ends (`\n`, `\r\n`), lines longer than
/// [`MAX_LINE`] cut into pieces.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    pending: Vec<u8>,
}

impl Lines {
    /// Takes in `bytes`, calling `line` with each line they complete.
    pub(crate) fn push(&mut self, bytes: &[u8], mut line: impl FnMut(&[u8])) {
        self.pending.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(end) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let whole = &self.pending[start..start + end];
            line(whole.strip_suffix(b"\r").unwrap_or(whole));
            start += end + 1;
        }
        self.pending.drain(..start);
        while self.pending.len() >= MAX_LINE {
            line(&self.pending[..MAX_LINE]);
            self.pending.drain(..MAX_LINE);
        }
    }

    /// The unfinished last line, if any.
    pub(crate) fn rest(&mut self) -> Option<Vec<u8>> {
        (!self.pending.is_empty()).then(|| std::mem::take(&mut self.pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_lose_their_ends_and_long_ones_are_cut() {
        let mut lines = Lines::default();
        let mut seen = Vec::new();
        lines.push(b"one\r\ntw", |l| seen.push(l.to_vec()));
        lines.push(b"o\n", |l| seen.push(l.to_vec()));
        lines.push(&vec![b'x'; MAX_LINE + 3], |l| seen.push(l.to_vec()));
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[0], b"one");
        assert_eq!(seen[1], b"two");
        assert_eq!(seen[2].len(), MAX_LINE);
        assert_eq!(lines.rest(), Some(b"xxx".to_vec()));
        assert_eq!(lines.rest(), None);
    }
}

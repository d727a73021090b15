//! The TensorBoard reporter: event files of rank 0's numeric metrics
//! (`RunConfig::tensorboard_dir`), which `tensorboard --logdir DIR` reads as they grow: one
//! file a driver, `events.out.tfevents.<seconds>.<host>.<pid>.trainyard`, each report at its
//! step (its index, as its checkpoint would be numbered: it goes on over restarts and
//! resumes).
//!
//! The format is TensorFlow's: TFRecords (`u64` length, its masked CRC-32C, the bytes, their
//! masked CRC-32C; little-endian) of `tensorflow.Event` protocol buffers — a first one with
//! `file_version: "brain.Event:2"`, then one per report with `wall_time`, `step` and a
//! `Summary` of `simple_value`s. Those three messages are written here field by field.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

/// The reporter: writes rank 0's reports to its event file until a write fails (said once;
/// the run goes on without it).
#[derive(Debug)]
pub(crate) struct TensorBoard {
    events: Option<EventFile>,
}

impl TensorBoard {
    /// A new event file in `dir` (`~/` for the home folder), or, when it cannot be made, a
    /// warning and no reporter.
    pub(crate) fn new(dir: &str) -> Option<Self> {
        let dir = crate::run_folder::expand_home(dir);
        match EventFile::create(&dir, trainyard_checkpoint::now()) {
            Ok(events) => Some(Self {
                events: Some(events),
            }),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot write TensorBoard event files there; the run goes on without them");
                None
            }
        }
    }
}

impl crate::Reporter for TensorBoard {
    fn report(&mut self, event: &crate::RunEvent) {
        let crate::RunEvent::Report {
            rank,
            metrics,
            step,
            time,
            ..
        } = event
        else {
            return;
        };
        let Some(events) = self.events.as_mut().filter(|_| rank.0 == 0) else {
            return;
        };
        if let Err(error) = events.scalars(*time, *step, metrics) {
            tracing::warn!(file = %events.path().display(), %error, "cannot write to the TensorBoard event file; it is left as it is");
            self.events = None;
        }
    }
}

/// CRC-32C, as TFRecords frame with it.
const CASTAGNOLI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// One driver's event file.
#[derive(Debug)]
pub(crate) struct EventFile {
    file: BufWriter<File>,
    path: PathBuf,
}

impl EventFile {
    /// Makes `dir` (mode 0700 where missing; one there must be this user's and not writable by
    /// every user) and a new event file in it (mode 0600, made anew, never through a link),
    /// which starts with its version event.
    pub(crate) fn create(dir: &Path, wall_time: f64) -> std::io::Result<Self> {
        trainyard_sys::private::named_dir(dir)?;
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|name| name.into_string().ok())
            .unwrap_or_else(|| "localhost".to_owned());
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}.trainyard",
            wall_time as u64,
            std::process::id()
        ));
        let file = trainyard_sys::private::create_new(&path)?;
        let mut events = Self {
            file: BufWriter::new(file),
            path,
        };
        let mut event = Vec::new();
        double(&mut event, 1, wall_time);
        bytes(&mut event, 3, b"brain.Event:2");
        events.write(&event)?;
        Ok(events)
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one event of the numeric `metrics` at `step` (others are passed over; none,
    /// nothing is written).
    pub(crate) fn scalars(
        &mut self,
        wall_time: f64,
        step: u64,
        metrics: &serde_json::Map<String, serde_json::Value>,
    ) -> std::io::Result<()> {
        let mut summary = Vec::new();
        for (tag, value) in metrics {
            let Some(value) = value.as_f64() else {
                continue;
            };
            let mut entry = Vec::new();
            bytes(&mut entry, 1, tag.as_bytes());
            // `simple_value` is a float.
            key(&mut entry, 2, 5);
            entry.extend_from_slice(&(value as f32).to_le_bytes());
            bytes(&mut summary, 1, &entry);
        }
        if summary.is_empty() {
            return Ok(());
        }
        let mut event = Vec::new();
        double(&mut event, 1, wall_time);
        key(&mut event, 2, 0);
        varint(&mut event, step);
        bytes(&mut event, 5, &summary);
        self.write(&event)
    }

    /// Frames `event` as a TFRecord and writes it through to the file.
    fn write(&mut self, event: &[u8]) -> std::io::Result<()> {
        let length = (event.len() as u64).to_le_bytes();
        self.file.write_all(&length)?;
        self.file.write_all(&masked_crc(&length).to_le_bytes())?;
        self.file.write_all(event)?;
        self.file.write_all(&masked_crc(event).to_le_bytes())?;
        self.file.flush()
    }
}

/// TFRecord's masked CRC-32C of `data`.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = CASTAGNOLI.checksum(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// A protocol buffer field's key: its number and wire type.
fn key(out: &mut Vec<u8>, field: u32, wire_type: u32) {
    varint(out, u64::from(field << 3 | wire_type));
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A `double` field.
fn double(out: &mut Vec<u8>, field: u32, value: f64) {
    key(out, field, 1);
    out.extend_from_slice(&value.to_le_bytes());
}

/// A length-delimited field (a string, bytes, or an embedded message).
fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    key(out, field, 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masked_crc_and_varints_are_tensorflows() {
        // CRC-32C of "123456789" is 0xe3069283 (RFC 3720's check value), masked as TFRecord
        // masks it.
        assert_eq!(CASTAGNOLI.checksum(b"123456789"), 0xe306_9283);
        assert_eq!(
            masked_crc(b"123456789"),
            0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }

    #[test]
    fn an_event_file_holds_framed_records_of_the_numeric_metrics() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut events = EventFile::create(dir.path(), 1_700_000_000.5).expect("created");
        let metrics = serde_json::json!({"loss": 0.5, "note": "text", "epoch": 3});
        events
            .scalars(1_700_000_001.0, 7, metrics.as_object().expect("an object"))
            .expect("written");
        let data = std::fs::read(events.path()).expect("read");
        let mut records = Vec::new();
        let mut at = 0;
        while at < data.len() {
            let length = u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes")) as usize;
            let crc = u32::from_le_bytes(data[at + 8..at + 12].try_into().expect("4 bytes"));
            assert_eq!(crc, masked_crc(&data[at..at + 8]));
            let body = &data[at + 12..at + 12 + length];
            let crc = u32::from_le_bytes(
                data[at + 12 + length..at + 16 + length]
                    .try_into()
                    .expect("4 bytes"),
            );
            assert_eq!(crc, masked_crc(body));
            records.push(body.to_vec());
            at += 16 + length;
        }
        assert_eq!(records.len(), 2);
        assert!(records[0].ends_with(b"brain.Event:2"));
        let second = &records[1];
        assert!(second.windows(4).any(|w| w == b"loss"));
        assert!(second.windows(5).any(|w| w == b"epoch"));
        assert!(
            !second.windows(4).any(|w| w == b"note"),
            "text is no scalar"
        );
    }
}

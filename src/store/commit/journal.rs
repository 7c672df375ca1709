//! The commit writer's journal: how a batch becomes durable without a sled flush.
//!
//! sled's `flush` hands the write to sled's I/O thread pool, which wakes every idle pool thread
//! (seven of them) for each hand-off, and then waits for the one that took it; with
//! `billing.sync_commit` that happened for every batch, a few thousand times a second, and the
//! wake-ups cost more CPU than the requests' own work. The writer instead appends each batch's
//! inserts here as one record and `fdatasync`s this file on its own thread, then applies them to
//! sled. sled is flushed once per checkpoint ([`CHECKPOINT_EVERY`], or sooner once the journal
//! passes [`CHECKPOINT_BYTES`]), after which the journal is emptied.
//!
//! When the database is opened, the records a crash left here are applied again, in order: a
//! record holds the last value each of its keys had in its batch, so applying one that sled
//! already has changes nothing, and applying them in order leaves each key with its newest
//! journaled value. Then sled is flushed and the journal emptied.
//!
//! The file is written in place, never grown while requests are served: it is filled with zeros
//! up to [`PREALLOCATED`] bytes once, and a checkpoint starts it over from the beginning under a
//! new generation number instead of truncating it. Writing into blocks the file already has means
//! `fdatasync` writes the record's blocks alone; appending made every sync write the inode too
//! (its size), a second disk write per batch.
//!
//! Layout: a header (`TGJ1`, four bytes reserved, the generation as u64 little-endian), then the
//! records. A record: its payload's length (u32, little-endian), a CRC-32 of the generation
//! followed by the payload (u32), the payload. The payload is the batch's inserts, each: tree
//! ([`TreeName::id`], one byte), key length (u32), key, value length (u32), value. The journal
//! ends at the first record that does not check out: zeros, a record of an earlier generation
//! (its checksum was taken with another number), or one cut short by the crash (its sync never
//! returned, so nobody was answered for it).

use super::{tree_of, TreeName};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The journal's file name inside the data directory.
pub const FILE: &str = "commit-journal";

/// Longest time between checkpoints while writes come.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Journal size that brings a checkpoint forward.
pub const CHECKPOINT_BYTES: u64 = 16 << 20;

/// The file's size once prepared: a checkpoint comes before the records reach it, so batches
/// are written into blocks the file already has.
pub const PREALLOCATED: u64 = CHECKPOINT_BYTES + (1 << 20);

/// A record's header: payload length and CRC-32.
const HEADER: usize = 8;

/// The file's header: magic, reserved, generation.
const FILE_HEADER: usize = 16;
const MAGIC: &[u8; 4] = b"TGJ1";

/// The open journal of one data directory.
pub struct Journal {
    file: File,
    path: PathBuf,
    /// The generation records are written under (one more at every checkpoint).
    generation: u64,
    /// Where the next record goes.
    at: u64,
    /// When the journal was last emptied.
    since: Instant,
    /// The record being encoded (kept between batches for its capacity).
    buf: Vec<u8>,
}

/// What opening found in a journal left by the previous process.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Records applied to sled again.
    pub records: usize,
    /// Inserts in them.
    pub inserts: usize,
}

fn io_error(path: &Path, e: std::io::Error) -> sled::Error {
    sled::Error::Io(std::io::Error::new(e.kind(), format!("commit journal {}: {e}", path.display())))
}

impl Journal {
    /// Open `dir`'s journal, first applying to `db` what a crash left in it, and prepare it
    /// for writing (a new generation, the file filled to [`PREALLOCATED`] bytes).
    pub fn open(dir: &Path, db: &sled::Db) -> Result<(Journal, Recovered), sled::Error> {
        let path = dir.join(FILE);
        let mut file =
            OpenOptions::new().create(true).read(true).write(true).truncate(false).open(&path).map_err(|e| io_error(&path, e))?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes).map_err(|e| io_error(&path, e))?;
        let mut recovered = Recovered::default();
        let mut generation = 0;
        if let Some((header, body)) = bytes.split_first_chunk::<FILE_HEADER>() {
            if &header[..4] != MAGIC {
                return Err(sled::Error::Unsupported(format!(
                    "{} is not a tollgate commit journal (it does not start with {MAGIC:?}); move it out of the data directory",
                    path.display()
                )));
            }
            generation = u64::from_le_bytes(header[8..].try_into().unwrap_or_default());
            let mut trees: Vec<(TreeName, sled::Tree)> = Vec::new();
            for payload in records(generation, body) {
                for insert in inserts(payload) {
                    let (tree, key, value) = insert.map_err(|bad| match bad {
                        Bad::Tree(id) => sled::Error::Unsupported(format!(
                            "commit journal {}: a record for an unknown tree ({id}), written by a newer tollgate; start that version to apply it",
                            path.display()
                        )),
                        // `records` only returns records whose inserts frame.
                        Bad::Framing => sled::Error::Unsupported(format!("commit journal {}: a record does not frame", path.display())),
                    })?;
                    tree_of(db, &mut trees, tree)?.insert(key, value)?;
                    recovered.inserts += 1;
                }
                recovered.records += 1;
            }
            if recovered.records > 0 {
                db.flush()?;
                log::warn!(
                    "commit journal: the previous process stopped between checkpoints; {} batch(es) ({} write(s)) applied again",
                    recovered.records,
                    recovered.inserts
                );
            }
        }
        let mut journal = Journal { file, path, generation, at: FILE_HEADER as u64, since: Instant::now(), buf: Vec::new() };
        journal.start_generation()?;
        let len = bytes.len() as u64;
        if len < PREALLOCATED {
            let zeros = vec![0u8; 1 << 20];
            let mut at = len.max(FILE_HEADER as u64);
            while at < PREALLOCATED {
                let n = zeros.len().min((PREALLOCATED - at) as usize);
                journal.file.write_all_at(&zeros[..n], at).map_err(|e| io_error(&journal.path, e))?;
                at += n as u64;
            }
        }
        journal.file.sync_all().map_err(|e| io_error(&journal.path, e))?;
        Ok((journal, recovered))
    }

    /// Write the header of the next generation: the records before it no longer count. It is
    /// made durable by the next record's sync (until then the old generation's records, all in
    /// sled, may still be read at a start; applying them again changes nothing).
    fn start_generation(&mut self) -> Result<(), sled::Error> {
        self.generation = self.generation.wrapping_add(1);
        let mut header = [0u8; FILE_HEADER];
        header[..4].copy_from_slice(MAGIC);
        header[8..].copy_from_slice(&self.generation.to_le_bytes());
        self.file.write_all_at(&header, 0).map_err(|e| io_error(&self.path, e))?;
        self.at = FILE_HEADER as u64;
        self.since = Instant::now();
        Ok(())
    }

    /// Write one batch's inserts as a record and wait until it is on disk (`fdatasync`). A
    /// record that failed half-way is overwritten by the next one (until then it ends the
    /// journal: its checksum fails).
    pub fn append(&mut self, inserts: &[(TreeName, Vec<u8>, Vec<u8>)]) -> Result<(), sled::Error> {
        if inserts.is_empty() {
            // A batch of barriers: what came before it is on disk already (and a record of no
            // length would read as the journal's end).
            return Ok(());
        }
        self.buf.clear();
        self.buf.extend_from_slice(&[0; HEADER]);
        for (tree, key, value) in inserts {
            self.buf.push(tree.id());
            for part in [key, value] {
                let len = u32::try_from(part.len())
                    .map_err(|_| sled::Error::Unsupported(format!("commit journal: an entry of {} bytes is over 4 GiB", part.len())))?;
                self.buf.extend_from_slice(&len.to_le_bytes());
                self.buf.extend_from_slice(part);
            }
        }
        let payload = self.buf.len() - HEADER;
        let len = u32::try_from(payload)
            .map_err(|_| sled::Error::Unsupported(format!("commit journal: a batch of {payload} bytes is over 4 GiB")))?;
        let crc = checksum(self.generation, &self.buf[HEADER..]);
        self.buf[..4].copy_from_slice(&len.to_le_bytes());
        self.buf[4..HEADER].copy_from_slice(&crc.to_le_bytes());
        self.file.write_all_at(&self.buf, self.at).and_then(|()| self.file.sync_data()).map_err(|e| io_error(&self.path, e))?;
        self.at += self.buf.len() as u64;
        Ok(())
    }

    /// A checkpoint is due: the journal is old or large.
    pub fn due(&self) -> bool {
        !self.is_empty() && (self.len() >= CHECKPOINT_BYTES || self.since.elapsed() >= CHECKPOINT_EVERY)
    }

    /// Start over, once sled holds (and has flushed) everything in the journal.
    pub fn clear(&mut self) -> Result<(), sled::Error> {
        self.start_generation()
    }

    /// Bytes of records since the journal was last emptied.
    pub fn len(&self) -> u64 {
        self.at - FILE_HEADER as u64
    }

    /// No record since the journal was last emptied.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A record's checksum: CRC-32 of its generation and payload.
fn checksum(generation: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&generation.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The payloads of the records of `generation` at the start of `body`, up to the first that
/// does not check out.
fn records(generation: u64, body: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some((header, after)) = rest.split_first_chunk::<HEADER>() {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let Some(payload) = after.get(..len).filter(|p| !p.is_empty()) else { break };
        if checksum(generation, payload) != crc {
            break;
        }
        if inserts(payload).any(|i| matches!(i, Err(Bad::Framing))) {
            log::error!("commit journal: a record with a valid checksum does not frame; the journal is read up to it");
            break;
        }
        out.push(payload);
        rest = &after[len..];
    }
    out
}

/// Why an insert of a record could not be read.
#[derive(Debug, PartialEq, Eq)]
enum Bad {
    /// The lengths do not add up (a damaged record that passed its checksum).
    Framing,
    /// A tree this version does not know.
    Tree(u8),
}

/// One length-prefixed part (key or value) from the front of `from`.
fn part<'a>(from: &mut &'a [u8]) -> Option<&'a [u8]> {
    let (len, after) = from.split_first_chunk::<4>()?;
    let len = u32::from_le_bytes(*len) as usize;
    let (part, rest) = (after.get(..len)?, after.get(len..)?);
    *from = rest;
    Some(part)
}

/// The inserts of a record's payload.
fn inserts(payload: &[u8]) -> impl Iterator<Item = Result<(TreeName, &[u8], &[u8]), Bad>> + '_ {
    let mut rest = payload;
    std::iter::from_fn(move || {
        let (&id, mut cursor) = rest.split_first()?;
        let (Some(key), Some(value)) = (part(&mut cursor), part(&mut cursor)) else {
            rest = &[];
            return Some(Err(Bad::Framing));
        };
        rest = cursor;
        Some(TreeName::from_id(id).map(|tree| (tree, key, value)).ok_or(Bad::Tree(id)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sled_in(dir: &Path) -> sled::Db {
        // No background flusher: what reaches sled's files is what the test flushes.
        sled::Config::new().path(dir).flush_every_ms(None).open().expect("sled")
    }

    fn put(tree: TreeName, key: &str, value: &str) -> (TreeName, Vec<u8>, Vec<u8>) {
        (tree, key.as_bytes().to_vec(), value.as_bytes().to_vec())
    }

    fn get(db: &sled::Db, tree: TreeName, key: &str) -> Option<String> {
        db.open_tree(tree.as_str()).expect("tree").get(key).expect("get").map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    #[test]
    fn batches_written_but_never_applied_are_applied_in_order_at_the_next_open_and_only_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled_in(dir.path());
        let (mut journal, recovered) = Journal::open(dir.path(), &db).expect("open");
        assert_eq!(recovered, Recovered::default());
        assert_eq!(std::fs::metadata(dir.path().join(FILE)).expect("file").len(), PREALLOCATED, "filled once, written in place");
        journal.append(&[put(TreeName::Balances, "k", "1"), put(TreeName::UsageRecords, "r1", "a")]).expect("append");
        journal.append(&[]).expect("a batch of barriers only");
        journal.append(&[put(TreeName::Balances, "k", "2"), put(TreeName::Audit, "x", "y")]).expect("append");
        drop(journal);
        // The process died before the batches reached sled.
        assert_eq!(get(&db, TreeName::Balances, "k"), None);
        let (journal, recovered) = Journal::open(dir.path(), &db).expect("reopen");
        assert_eq!(recovered, Recovered { records: 2, inserts: 4 });
        assert_eq!(get(&db, TreeName::Balances, "k").as_deref(), Some("2"), "the later batch's value wins");
        assert_eq!(get(&db, TreeName::UsageRecords, "r1").as_deref(), Some("a"));
        assert_eq!(get(&db, TreeName::Audit, "x").as_deref(), Some("y"));
        assert_eq!(journal.len(), 0);
        drop(journal);
        // Applied records are not applied again: a value changed since stays.
        db.open_tree(TreeName::Balances.as_str()).expect("tree").insert("k", "3").expect("insert");
        let (_journal, recovered) = Journal::open(dir.path(), &db).expect("third open");
        assert_eq!(recovered, Recovered::default());
        assert_eq!(get(&db, TreeName::Balances, "k").as_deref(), Some("3"));
    }

    #[test]
    fn a_checkpoint_retires_the_records_before_it_and_the_next_ones_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled_in(dir.path());
        let (mut journal, _) = Journal::open(dir.path(), &db).expect("open");
        journal.append(&[put(TreeName::Balances, "old", "1"), put(TreeName::Balances, "k", "old")]).expect("append");
        assert!(!journal.due(), "young and small");
        journal.clear().expect("checkpoint");
        assert_eq!(journal.len(), 0);
        // Shorter than the retired record: its tail still lies behind the new one in the file.
        journal.append(&[put(TreeName::Balances, "k", "new")]).expect("append");
        drop(journal);
        let (_journal, recovered) = Journal::open(dir.path(), &db).expect("reopen");
        assert_eq!(recovered, Recovered { records: 1, inserts: 1 });
        assert_eq!(get(&db, TreeName::Balances, "k").as_deref(), Some("new"));
        assert_eq!(get(&db, TreeName::Balances, "old"), None, "a retired record is not applied");
    }

    #[test]
    fn a_record_cut_anywhere_ends_the_journal_after_the_whole_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled_in(dir.path());
        let (mut journal, _) = Journal::open(dir.path(), &db).expect("open");
        journal.append(&[put(TreeName::UsageRecords, "a", "first")]).expect("append");
        let first_end = FILE_HEADER + journal.len() as usize;
        journal.append(&[put(TreeName::UsageRecords, "b", "second"), put(TreeName::Balances, "k", "9")]).expect("append");
        let second_end = FILE_HEADER + journal.len() as usize;
        let generation = journal.generation;
        drop(journal);
        let whole = std::fs::read(dir.path().join(FILE)).expect("read");
        let body = |bytes: &[u8]| bytes[FILE_HEADER..].to_vec();
        assert_eq!(records(generation, &body(&whole)).len(), 2);
        // The second record's write stopped at every possible byte (the rest as it was: zeros),
        // or one of its bytes was never written.
        for cut in first_end..second_end {
            let mut torn = whole.clone();
            torn[cut..second_end].fill(0);
            assert_eq!(records(generation, &body(&torn)), vec![&whole[FILE_HEADER + HEADER..first_end]], "cut at {cut}");
            let mut flipped = whole.clone();
            flipped[cut] ^= 0x40;
            assert_eq!(records(generation, &body(&flipped)).len(), 1, "byte {cut} damaged");
        }
        // Records of another generation do not count.
        assert!(records(generation + 1, &body(&whole)).is_empty());
    }

    #[test]
    fn a_file_that_is_not_a_journal_or_a_record_for_an_unknown_tree_stops_the_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled_in(dir.path());
        std::fs::write(dir.path().join(FILE), b"something else entirely").expect("write");
        let e = Journal::open(dir.path(), &db).err().expect("refused").to_string();
        assert!(e.contains("is not a tollgate commit journal"), "{e}");
        std::fs::remove_file(dir.path().join(FILE)).expect("remove");

        let (mut journal, _) = Journal::open(dir.path(), &db).expect("open");
        journal.append(&[put(TreeName::Balances, "k", "1")]).expect("append");
        let generation = journal.generation;
        drop(journal);
        // The same record as a newer version would write it for a tree this one lacks.
        let mut bytes = std::fs::read(dir.path().join(FILE)).expect("read");
        let payload = FILE_HEADER + HEADER;
        bytes[payload] = 200;
        let len = u32::from_le_bytes(bytes[FILE_HEADER..FILE_HEADER + 4].try_into().expect("four")) as usize;
        let crc = checksum(generation, &bytes[payload..payload + len]);
        bytes[FILE_HEADER + 4..payload].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(dir.path().join(FILE), &bytes).expect("write");
        let e = Journal::open(dir.path(), &db).err().expect("refused").to_string();
        assert!(e.contains("unknown tree (200)"), "{e}");
        assert_eq!(get(&db, TreeName::Balances, "k"), None, "nothing applied from a journal that cannot be read whole");
    }
}

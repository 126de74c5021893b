//! safetensors files: the reader that checks every header entry against the file before any
//! byte is trusted, the set of files of a (possibly sharded) checkpoint, and a streaming writer
//! that never leaves a half-written file under the final name.
//!
//! Layout: 8 bytes little-endian header length N, N bytes of JSON header, then the data.
//! Each header entry is `name: {dtype, shape, data_offsets: [begin, end]}` with offsets relative
//! to the start of the data; `__metadata__` is a map of strings.

use super::dtype::DType;
use super::json::{self, Json};
use super::dtype::{shape_problem, Width, META_BLOCK, META_SCALE};
use crate::error::{Error, ErrorKind, Result};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A header can be large (sharded checkpoints list thousands of tensors) but not unbounded.
pub const MAX_HEADER_BYTES: u64 = 100 << 20;

/// One tensor's entry, with its byte range made absolute in the file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// The tensor's name in the header.
    pub name: String,
    /// Its element type (`dtype` field).
    pub dtype: DType,
    /// Its dimensions, outermost first (checked: their product in bytes overflows nothing).
    pub shape: Vec<u64>,
    /// Absolute file offset of the first byte.
    pub offset: u64,
    /// Length in bytes (= shape × dtype size, checked).
    pub len: u64,
}

impl TensorInfo {
    /// Number of elements (weights, for the block widths).
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// An open safetensors file whose header has been validated.
pub struct SafeTensors {
    /// The file, for error messages.
    pub path: PathBuf,
    /// The open file, read with positioned reads.
    pub file: File,
    /// The file's size when opened (every tensor's range lies inside it).
    pub file_size: u64,
    /// Every tensor of the header, in header order.
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` string pairs.
    pub metadata: Vec<(String, String)>,
    /// The block width of a quantized file (seed 000), `None` for an ordinary one.
    pub width: Option<Width>,
    by_name: HashMap<String, usize>,
}

impl SafeTensors {
    /// Opens `path` and validates its header: the length bounded by the file, valid UTF-8 JSON,
    /// known dtypes, offsets inside the data, lengths matching shape × dtype, no overlaps, and
    /// for a quantized file the rules of [`check_header`] (block scales are checked when
    /// a tensor's bytes are read: [`crate::format::quant::check_scales`]).
    pub fn open(path: &Path) -> Result<SafeTensors> {
        SafeTensors::open_within(path, &json::Limits::default())
    }

    /// [`SafeTensors::open`] with the header's bytes and everything parsed from them held
    /// within `limits` (a header over the limit is refused before it is read).
    pub(crate) fn open_within(path: &Path, limits: &json::Limits) -> Result<SafeTensors> {
        let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let file_size = file.metadata().map_err(|e| Error::io(path, "stat", e))?.len();
        if file_size < 8 {
            return Err(Error::format(path, format!(
                "file is {file_size} bytes, shorter than the 8-byte header length")));
        }
        let mut len_bytes = [0u8; 8];
        crate::sys::read_exact_at(&file, path, &mut len_bytes, 0)?;
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > file_size - 8 {
            return Err(Error::format(path, format!(
                "header length {header_len} at byte 0 runs past the end of the {file_size}-byte file")));
        }
        if header_len > MAX_HEADER_BYTES {
            return Err(Error::format(path, format!(
                "header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit")));
        }
        limits.check_input(header_len).map_err(|e| Error::format(path, format!("header: {}", e.message)))?;
        let mut header = vec![0u8; header_len as usize];
        crate::sys::read_exact_at(&file, path, &mut header, 8)?;
        let data_start = 8 + header_len;
        let (tensors, metadata, by_name) = parse_header(path, &header, data_start, file_size, limits)?;
        drop(header);
        let width = check_header(path, &tensors, &metadata)?;
        Ok(SafeTensors { path: path.to_path_buf(), file, file_size, tensors, metadata, width, by_name })
    }

    /// Heap bytes of the header as held: the entries (names, shapes), the name lookup (its
    /// keys are copies of the names) and the metadata pairs.
    pub fn index_bytes(&self) -> u64 {
        use crate::sys::{hash_map_bytes, vec_bytes};
        let names: u64 = self.tensors.iter().map(|t| t.name.capacity() as u64).sum();
        let shapes: u64 = self.tensors.iter().map(|t| vec_bytes(&t.shape)).sum();
        let metadata: u64 = self.metadata.iter().map(|(k, v)| (k.capacity() + v.capacity()) as u64).sum();
        vec_bytes(&self.tensors) + 2 * names + shapes + vec_bytes(&self.metadata) + metadata
            + hash_map_bytes(self.by_name.capacity(), std::mem::size_of::<(String, usize)>())
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The `__metadata__` value for `key`.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Reads the bytes of `t` (an entry of this file) into `buf`, which must be `t.len` long.
    pub fn read_into(&self, t: &TensorInfo, buf: &mut [u8]) -> Result<()> {
        if buf.len() as u64 != t.len {
            return Err(Error::new(ErrorKind::Tensor, format!(
                "{}: tensor `{}`: buffer of {} bytes for {} bytes of data",
                self.path.display(), t.name, buf.len(), t.len)));
        }
        crate::sys::read_exact_at(&self.file, &self.path, buf, t.offset)
            .map_err(|e| e.context(format!("tensor `{}`", t.name)))
    }
}

/// The header's entries, parsed one at a time (a hostile header never becomes one big tree):
/// the tensors, the metadata and the index by name.
type Header = (Vec<TensorInfo>, Vec<(String, String)>, HashMap<String, usize>);

fn parse_header(path: &Path, header: &[u8], data_start: u64, file_size: u64, limits: &json::Limits) -> Result<Header> {
    std::str::from_utf8(header).map_err(|e| {
        Error::format(path, format!("header is not UTF-8 at byte {}", 8 + e.valid_up_to()))
    })?;
    let data_size = file_size - data_start;
    let mut tensors = Vec::new();
    let mut metadata = None;
    let mut by_name: HashMap<String, usize> = HashMap::new();
    let mut failure = None;
    json::for_each_member(header, limits, |name, entry| {
        let entry_result = if name == "__metadata__" {
            if metadata.is_some() {
                Err(Error::format(path, "tensor `__metadata__` appears twice in the header"))
            } else {
                parse_metadata(path, &entry).map(|m| {
                    let kept = m.iter().map(|(k, v)| k.len() + v.len() + 80).sum::<usize>();
                    metadata = Some(m);
                    kept as u64
                })
            }
        } else {
            match by_name.entry(name) {
                Entry::Occupied(e) => Err(Error::format(path, format!("tensor `{}` appears twice in the header", e.key()))),
                Entry::Vacant(slot) => parse_entry(path, slot.key(), &entry, data_start, data_size).map(|t| {
                    // What the entry keeps: its TensorInfo, name (twice, with the index) and
                    // shape, each block with its allocator header, and its share of the index's
                    // table.
                    let kept = std::mem::size_of::<TensorInfo>() as u64 * 2 + 2 * slot.key().len() as u64 + 8 * t.shape.len() as u64 + 96;
                    slot.insert(tensors.len());
                    tensors.push(t);
                    kept
                }),
            }
        };
        entry_result.map_err(|e| {
            let message = e.message().to_string();
            failure = Some(e);
            message
        })
    })
    .map_err(|e| match failure.take() {
        Some(f) => f,
        None => Error::format(path, format!("header: invalid JSON at byte {}: {}", 8 + e.offset, e.message)),
    })?;
    let metadata = metadata.unwrap_or_default();
    // Overlap check: sort the ranges and compare neighbours. Empty tensors overlap nothing.
    let mut order: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].len > 0).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.len > b.offset {
            return Err(Error::format(path, format!(
                "tensors `{}` (data bytes {}..{}) and `{}` (data bytes {}..{}) overlap",
                a.name, a.offset - data_start, a.offset + a.len - data_start,
                b.name, b.offset - data_start, b.offset + b.len - data_start)));
        }
    }
    Ok((tensors, metadata, by_name))
}

fn parse_metadata(path: &Path, entry: &Json) -> Result<Vec<(String, String)>> {
    let Some(m) = entry.as_object() else {
        return Err(Error::format(path, "`__metadata__` is not an object"));
    };
    // Repeats are refused here as for tensor names: which one a reader takes is not agreed on.
    let mut seen = std::collections::HashSet::new();
    if let Some((k, _)) = m.iter().find(|(k, _)| !seen.insert(k.as_str())) {
        return Err(Error::format(path, format!("`__metadata__` field `{k}` appears twice")));
    }
    m.iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) => Ok((k.clone(), s.to_string())),
            None => Err(Error::format(path, format!(
                "`__metadata__` field `{k}` is {}, not a string", v.type_name()))),
        })
        .collect()
}

fn parse_entry(path: &Path, name: &str, entry: &Json, data_start: u64, data_size: u64) -> Result<TensorInfo> {
    let bad = |msg: String| Error::format(path, format!("tensor `{name}`: {msg}"));
    if entry.as_object().is_none() {
        return Err(bad(format!("entry is {}, not an object", entry.type_name())));
    }
    let dtype_name = entry.get("dtype").and_then(Json::as_str)
        .ok_or_else(|| bad("field `dtype` is missing or not a string".into()))?;
    let dtype = DType::from_name(dtype_name).filter(|&d| d != DType::F8B32)
        .ok_or_else(|| bad(format!("field `dtype`: unknown dtype `{dtype_name}`")))?;
    let shape_json = entry.get("shape").and_then(Json::as_array)
        .ok_or_else(|| bad("field `shape` is missing or not an array".into()))?;
    let shape = shape_json.iter().map(|d| d.as_u64()).collect::<Option<Vec<u64>>>()
        .ok_or_else(|| bad("field `shape` holds something other than non-negative integers".into()))?;
    let offsets = entry.get("data_offsets").and_then(Json::as_array)
        .ok_or_else(|| bad("field `data_offsets` is missing or not an array".into()))?;
    let (begin, end) = match offsets {
        [b, e] => match (b.as_u64(), e.as_u64()) {
            (Some(b), Some(e)) => (b, e),
            _ => return Err(bad("field `data_offsets` holds something other than two non-negative integers".into())),
        },
        _ => return Err(bad(format!("field `data_offsets` has {} values, not 2", offsets.len()))),
    };
    if begin > end {
        return Err(bad(format!("field `data_offsets` [{begin}, {end}] is reversed (begin {begin} > end {end})")));
    }
    if end > data_size {
        return Err(bad(format!(
            "field `data_offsets` [{begin}, {end}] is outside the {data_size} data bytes (file offset {})",
            data_start.saturating_add(end))));
    }
    let expected = dtype.tensor_bytes(&shape).ok_or_else(|| {
        bad(shape_problem(dtype, &shape).unwrap_or_else(|| format!("field `shape` {shape:?} overflows")))
    })?;
    if end - begin != expected {
        return Err(bad(format!(
            "field `data_offsets` covers {} bytes but shape {shape:?} of {dtype} needs {expected}",
            end - begin)));
    }
    Ok(TensorInfo { name: name.to_string(), dtype, shape, offset: data_start + begin, len: end - begin })
}

/// The tensors of a checkpoint directory: `model.safetensors`, or the shards named by
/// `model.safetensors.index.json`, with each tensor found by name across the files.
pub struct Checkpoint {
    /// The checkpoint's directory.
    pub dir: PathBuf,
    /// Its safetensors files (one, or the shards in index order).
    pub files: Vec<SafeTensors>,
}

impl Checkpoint {
    /// Opens the weights of a Hugging Face checkpoint directory (or a single `.safetensors` file).
    pub fn open(path: &Path) -> Result<Checkpoint> {
        Checkpoint::open_within(path, &json::Limits::default())
    }

    /// [`Checkpoint::open`] with each header (and the shard index) parsed within `limits`.
    pub(crate) fn open_within(path: &Path, limits: &json::Limits) -> Result<Checkpoint> {
        let (dir, names) = if path.is_file() {
            (path.parent().unwrap_or(Path::new(".")).to_path_buf(), vec![path.to_path_buf()])
        } else {
            (path.to_path_buf(), shard_paths(path, limits)?)
        };
        Checkpoint::from_paths(&dir, &names, limits)
    }

    /// Opens the named files of `dir` as one checkpoint (a container's trunk).
    pub fn open_files(dir: &Path, names: &[String]) -> Result<Checkpoint> {
        Checkpoint::open_files_within(dir, names, &json::Limits::default())
    }

    /// [`Checkpoint::open_files`] with each header parsed within `limits`.
    pub(crate) fn open_files_within(dir: &Path, names: &[String], limits: &json::Limits) -> Result<Checkpoint> {
        let paths: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
        Checkpoint::from_paths(dir, &paths, limits)
    }

    fn from_paths(dir: &Path, names: &[PathBuf], limits: &json::Limits) -> Result<Checkpoint> {
        let files = names.iter().map(|p| SafeTensors::open_within(p, limits)).collect::<Result<Vec<_>>>()?;
        Checkpoint::from_files(dir, files)
    }

    /// One checkpoint of files whose headers are already read; a tensor name may appear in
    /// only one of them. Names are looked up in each file's own index, not copied into a
    /// second one: the index is what opening a model holds beside its weights.
    pub(crate) fn from_files(dir: &Path, files: Vec<SafeTensors>) -> Result<Checkpoint> {
        for (fi, st) in files.iter().enumerate() {
            for t in &st.tensors {
                if let Some(other) = files[..fi].iter().find(|f| f.get(&t.name).is_some()) {
                    return Err(Error::format(&st.path, format!(
                        "tensor `{}` also appears in {}", t.name, other.path.display())));
                }
            }
        }
        Ok(Checkpoint { dir: dir.to_path_buf(), files })
    }

    /// The entry named `name` and the file it lives in.
    pub fn get(&self, name: &str) -> Option<(&SafeTensors, &TensorInfo)> {
        self.files.iter().find_map(|f| f.get(name).map(|t| (f, t)))
    }

    /// Heap bytes of the tensor index (every file's entries and name lookup): what a model's
    /// open holds beside its weights while they load (`MemoryPlan::open_index_bytes`).
    pub fn index_bytes(&self) -> u64 {
        crate::sys::vec_bytes(&self.files) + self.files.iter().map(SafeTensors::index_bytes).sum::<u64>()
    }

    /// Every tensor, file by file, in header order.
    pub fn tensors(&self) -> impl Iterator<Item = (&SafeTensors, &TensorInfo)> {
        self.files.iter().flat_map(|f| f.tensors.iter().map(move |t| (f, t)))
    }

    /// The block width of the first quantized file, `None` when no file is quantized. (The
    /// seed's rule is one width per *file*: a container's trunk keeps, for example, Q8B32
    /// embeddings and Q4B32 projections in two files of one checkpoint.)
    pub fn width(&self) -> Option<Width> {
        self.files.iter().find_map(|f| f.width)
    }

    /// The weight files' names, comma-separated (for messages about a tensor none of them has).
    pub fn file_names(&self) -> String {
        self.files.iter()
            .map(|f| f.path.file_name().map_or_else(|| f.path.display().to_string(), |n| n.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Total bytes of the weight files.
    pub fn file_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.file_size).sum()
    }
}

/// The weight files of a directory: the index's shards in first-seen order, else
/// `model.safetensors`.
fn shard_paths(dir: &Path, limits: &json::Limits) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let root = super::read_json_within(&index, 64 << 20, limits)?;
        let map = root.get("weight_map").and_then(Json::as_object)
            .ok_or_else(|| Error::format(&index, "field `weight_map` is missing or not an object"))?;
        let mut shards: Vec<PathBuf> = Vec::new();
        for (tensor, file) in map {
            let Some(f) = file.as_str() else {
                return Err(Error::format(&index, format!("weight_map entry `{tensor}` is not a string")));
            };
            // Shard names are plain file names inside the directory; refuse paths.
            if f.is_empty() || f.contains('/') || f.contains('\\') || f == ".." {
                return Err(Error::format(&index, format!("weight_map entry `{tensor}` names `{f}`, not a file in the directory")));
            }
            let p = dir.join(f);
            if !shards.contains(&p) {
                // Named here, with the entry that points at it: opening it later could only say
                // that some file is missing, not which tensor the index expected there.
                if !p.is_file() {
                    return Err(Error::new(ErrorKind::Io, format!(
                        "{}: weight_map entry `{tensor}` names shard `{f}`, which is not a file in {}",
                        index.display(), dir.display())));
                }
                shards.push(p);
            }
        }
        if shards.is_empty() {
            return Err(Error::format(&index, "weight_map is empty"));
        }
        return Ok(shards);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(Error::new(ErrorKind::Io, format!(
        "{}: no model.safetensors or model.safetensors.index.json", dir.display())))
}

/// One tensor to write: its name, dtype, shape, and exact byte length.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its dimensions, outermost first.
    pub shape: Vec<u64>,
}

/// Writes a safetensors file tensor by tensor without holding the whole model: the header is
/// computed from the specs first, then each tensor's bytes are streamed in order. The file is
/// written under a temporary name, synced, and renamed into place by [`Writer::finish`]; a
/// writer dropped before then (an error on the way) removes it. [`Writer::create`] uses the
/// fixed name `.NAME.tmp` (a resumed conversion overwrites what a killed one left);
/// [`Writer::create_unique`] a name of its own, for writers that may run concurrently.
pub struct Writer {
    out: std::io::BufWriter<File>,
    temp: TempGuard,
    expected: Vec<(String, u64)>,
    next: usize,
    written_in_tensor: u64,
    /// The CRC-32 and length of everything written so far (header included): a container
    /// records them per trunk file without reading the file back.
    crc: super::crc32::Crc32,
    bytes: u64,
}

impl Writer {
    /// Creates `path`'s temporary sibling `.NAME.tmp` and writes the header for `specs` (in that
    /// order) with `metadata` as `__metadata__`.
    pub fn create(path: &Path, specs: &[TensorSpec], metadata: &[(String, String)]) -> Result<Writer> {
        Writer::start(TempFile::create_fixed(path)?, specs, metadata)
    }

    /// As [`Writer::create`], under a temporary name no other writer uses ([`TempFile::create`]).
    pub fn create_unique(path: &Path, specs: &[TensorSpec], metadata: &[(String, String)]) -> Result<Writer> {
        Writer::start(TempFile::create(path)?, specs, metadata)
    }

    fn start(temp: TempFile, specs: &[TensorSpec], metadata: &[(String, String)]) -> Result<Writer> {
        let mut members = Vec::new();
        if !metadata.is_empty() {
            members.push(("__metadata__".to_string(),
                Json::object(metadata.iter().map(|(k, v)| (k.clone(), Json::str(v.clone()))))));
        }
        let mut offset = 0u64;
        let mut expected = Vec::with_capacity(specs.len());
        for s in specs {
            let len = s.dtype.tensor_bytes(&s.shape).ok_or_else(|| Error::new(ErrorKind::Tensor,
                format!("tensor `{}`: shape {:?} does not fit {}", s.name, s.shape, s.dtype)))?;
            members.push((s.name.clone(), Json::object([
                ("dtype", Json::str(s.dtype.name())),
                ("shape", Json::Array(s.shape.iter().map(|&d| Json::uint(d)).collect())),
                ("data_offsets", Json::Array(vec![Json::uint(offset), Json::uint(offset + len)])),
            ])));
            expected.push((s.name.clone(), len));
            offset += len;
        }
        let mut header = Json::Object(members).to_string_compact().into_bytes();
        // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
        while !(8 + header.len()).is_multiple_of(8) {
            header.push(b' ');
        }
        let (file, temp) = temp.into_parts();
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        let path = temp.path.clone();
        let io = |e| Error::io(&path, "write", e);
        let len = (header.len() as u64).to_le_bytes();
        out.write_all(&len).map_err(io)?;
        out.write_all(&header).map_err(io)?;
        let mut crc = super::crc32::Crc32::new();
        crc.update(&len);
        crc.update(&header);
        let bytes = 8 + header.len() as u64;
        Ok(Writer { out, temp, expected, next: 0, written_in_tensor: 0, crc, bytes })
    }

    /// Appends bytes of the current tensor (tensors are written in spec order; a tensor may be
    /// written in several calls).
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let Some((name, len)) = self.expected.get(self.next) else {
                return Err(Error::new(ErrorKind::Tensor, format!(
                    "{}: {} bytes written past the last tensor", self.temp.path.display(), rest.len())));
            };
            let room = (len - self.written_in_tensor) as usize;
            let take = room.min(rest.len());
            self.out.write_all(&rest[..take]).map_err(|e| Error::io(&self.temp.path, &format!("write tensor `{name}`"), e))?;
            self.crc.update(&rest[..take]);
            self.bytes += take as u64;
            self.written_in_tensor += take as u64;
            rest = &rest[take..];
            if self.written_in_tensor == *len {
                self.next += 1;
                self.written_in_tensor = 0;
            }
        }
        // Skip over empty tensors so `finish` sees them as done.
        while self.expected.get(self.next).is_some_and(|(_, l)| *l == 0) {
            self.next += 1;
        }
        Ok(())
    }

    /// Checks every tensor was written in full, syncs the file and renames it into place.
    pub fn finish(self) -> Result<PathBuf> {
        let (pending, _) = self.finish_pending_with_sum()?;
        pending.commit()
    }

    /// [`Writer::finish`], returning the finished file's size and CRC-32.
    pub fn finish_with_sum(self) -> Result<super::crc32::FileSum> {
        let (pending, sum) = self.finish_pending_with_sum()?;
        pending.commit()?;
        Ok(sum)
    }

    /// Checks every tensor was written in full and syncs the file, but leaves it under its
    /// temporary name: the caller checks it (or writes the files that must accompany it)
    /// and then calls [`TempFile::commit`]; dropping it instead removes it.
    pub fn finish_pending(self) -> Result<TempFile> {
        Ok(self.finish_pending_with_sum()?.0)
    }

    fn finish_pending_with_sum(mut self) -> Result<(TempFile, super::crc32::FileSum)> {
        while self.expected.get(self.next).is_some_and(|(_, l)| *l == 0) {
            self.next += 1;
        }
        if let Some((name, len)) = self.expected.get(self.next) {
            return Err(Error::new(ErrorKind::Tensor, format!(
                "{}: tensor `{name}` has {} of its {len} bytes", self.temp.path.display(), self.written_in_tensor)));
        }
        let path = self.temp.path.clone();
        self.out.flush().map_err(|e| Error::io(&path, "write", e))?;
        let sum = super::crc32::FileSum { bytes: self.bytes, crc32: self.crc.finish() };
        let file = self.out.into_inner().map_err(|e| Error::io(&path, "write", e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&path, "fsync", e))?;
        Ok((TempFile { file, temp: self.temp }, sum))
    }
}
/// Removes a temporary file when dropped, unless disarmed (after the rename into place).
struct TempGuard {
    /// The destination the temporary file stands for (named in errors).
    path: PathBuf,
    tmp: PathBuf,
    armed: bool,
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A file written under a temporary name beside its destination, renamed into place by
/// [`TempFile::commit`] and removed if dropped before: a failed write never leaves a
/// half-written file under the final name, nor a stray temporary one. The temporary name
/// is `.NAME.PID.N.tmp`, created exclusively (N counts up past names in use), so concurrent
/// writers of one destination, in this process or others, never share a temporary file. A
/// writer killed inside its write leaves its temporary file behind; the next
/// [`TempFile::create`] of the same destination removes those whose process is gone.
pub struct TempFile {
    file: File,
    temp: TempGuard,
}

impl TempFile {
    /// Creates the temporary sibling of `path`. Errors name `path`, the file the caller asked
    /// for, and the reason.
    pub fn create(path: &Path) -> Result<TempFile> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let pid = std::process::id();
        sweep_dead_writers_temps(path, &name, pid);
        for n in 0..10_000u32 {
            let tmp = path.with_file_name(format!(".{name}.{pid}.{n}.tmp"));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(file) => return Ok(TempFile { file, temp: TempGuard { path: path.to_path_buf(), tmp, armed: true } }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(path, "create", e)),
            }
        }
        Err(Error::new(ErrorKind::Io, format!("{}: cannot create: every temporary name beside it is taken", path.display())))
    }

    /// A temporary file under the fixed name `.NAME.tmp` (created or truncated), for writers
    /// whose next run should overwrite what a killed one left.
    pub fn create_fixed(path: &Path) -> Result<TempFile> {
        let tmp = temp_sibling(path);
        let file = File::create(&tmp).map_err(|e| Error::io(path, "create", e))?;
        Ok(TempFile { file, temp: TempGuard { path: path.to_path_buf(), tmp, armed: true } })
    }

    /// The temporary file's path (where the bytes are until [`TempFile::commit`]).
    pub fn temp_path(&self) -> &Path {
        &self.temp.tmp
    }

    /// The destination.
    pub fn path(&self) -> &Path {
        &self.temp.path
    }

    /// The open file, for writing.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    fn into_parts(self) -> (File, TempGuard) {
        let TempFile { file, temp } = self;
        (file, temp)
    }

    /// Syncs the file, renames it to its destination and syncs the directory, so that after a
    /// crash the destination is either the old file or the complete new one.
    pub fn commit(self) -> Result<PathBuf> {
        let TempFile { file, mut temp } = self;
        file.sync_all().map_err(|e| Error::io(&temp.path, "fsync", e))?;
        drop(file);
        std::fs::rename(&temp.tmp, &temp.path).map_err(|e| Error::io(&temp.path, "rename into place", e))?;
        temp.armed = false;
        sync_parent(&temp.path);
        Ok(temp.path.clone())
    }
}

/// Removes what writers of `path` killed inside their write left: files named exactly
/// `.NAME.PID.N.tmp` (NAME the destination's, PID and N decimal) beside it whose process no
/// longer exists. Never this process's own (another thread may be writing one), never a live
/// process's, never a name of another form or anything but a regular file. Best effort: a
/// directory that cannot be listed or a file that cannot be removed is left as it is, and
/// the write goes on. (A PID reused by a new process keeps its file until that one is gone.)
fn sweep_dead_writers_temps(path: &Path, name: &str, own_pid: u32) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name.to_str().and_then(|f| temp_writer_pid(f, name)) else { continue };
        if pid == own_pid || crate::sys::process_exists(pid) {
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The PID in `file_name` when it is a temporary name [`TempFile::create`] makes for the
/// destination `name` (`.NAME.PID.N.tmp`, both numbers as it writes them: decimal, no sign,
/// no leading zero), else `None`.
fn temp_writer_pid(file_name: &str, name: &str) -> Option<u32> {
    let rest = file_name.strip_prefix('.')?.strip_prefix(name)?.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (pid, n) = rest.split_once('.')?;
    let canonical = |s: &str| s.parse::<u32>().ok().filter(|v| v.to_string() == s);
    canonical(n)?;
    canonical(pid)
}

/// `dir/name` → `dir/.name.tmp`: the fixed temporary name, for writers that resume from (or
/// overwrite) what an interrupted run left there (a container's expert banks, [`Writer::create`]).
pub fn temp_sibling(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let dot = if name.starts_with('.') { "" } else { "." };
    path.with_file_name(format!("{dot}{name}.tmp"))
}

/// Syncs `file` (written at `tmp`), renames it to `path` and syncs the directory, so that after
/// a crash `path` is either the old file or the complete new one.
pub fn commit_file(file: File, tmp: &Path, path: &Path) -> Result<()> {
    file.sync_all().map_err(|e| Error::io(tmp, "fsync", e))?;
    drop(file);
    std::fs::rename(tmp, path).map_err(|e| Error::io(path, "rename into place", e))?;
    sync_parent(path);
    Ok(())
}

/// Syncs the directory holding `path` (best effort: a rename is durable once it is synced).
fn sync_parent(path: &Path) {
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
}

/// Writes `bytes` to `path` atomically (a [`TempFile`], fsync, rename). Errors name `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut t = TempFile::create(path)?;
    t.file().write_all(bytes).map_err(|e| Error::io(path, "write", e))?;
    t.commit().map(|_| ())
}

/// The header rules of a quantized file (seed 000, "The file"), checked on every safetensors
/// file the engine opens. Returns the file's width, or `None` for an ordinary file (no
/// quantized tensor and no `rabbit-` format). Shapes and byte lengths of quantized tensors are
/// already checked entry by entry ([`shape_problem`] and the length check of the reader).
pub fn check_header(path: &Path, tensors: &[TensorInfo], metadata: &[(String, String)]) -> Result<Option<Width>> {
    let bad = |msg: String| Error::format(path, msg);
    // One file, one width.
    let mut first: Option<(Width, &str)> = None;
    for t in tensors {
        let Some(w) = Width::from_dtype(t.dtype) else { continue };
        match first {
            None => first = Some((w, &t.name)),
            Some((w0, name0)) if w0 != w => {
                return Err(bad(format!(
                    "tensor `{}`: field `dtype` is {} but tensor `{name0}` is {}: a file carries one width",
                    t.name, t.dtype, w0.dtype())));
            }
            Some(_) => {}
        }
    }
    let meta = |key: &str| metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let format = meta("format");
    let rabbit = format.is_some_and(|f| f.starts_with("rabbit-"));
    if first.is_none() && !rabbit {
        return Ok(None);
    }
    let what = match first {
        Some((w, name)) => format!("tensor `{name}` is {}", w.dtype()),
        None => "the file declares a rabbit format".to_string(),
    };
    if metadata.is_empty() {
        return Err(bad(format!("{what} but `__metadata__` is missing (a quantized file declares format, block and scale)")));
    }
    let format = format.ok_or_else(|| bad(format!("{what} but `__metadata__` has no field `format`")))?;
    let width = Width::from_format(format).ok_or_else(|| bad(format!(
        "`__metadata__` field `format` is `{format}`, not `rabbit-q4b32` or `rabbit-q8b32`")))?;
    if let Some((w, name)) = first {
        if w != width {
            return Err(bad(format!("tensor `{name}`: field `dtype` is {} but `__metadata__` field `format` is `{format}`",
                w.dtype())));
        }
    }
    match meta("block") {
        Some(META_BLOCK) => {}
        Some(v) => return Err(bad(format!("`__metadata__` field `block` is `{v}`, not `{META_BLOCK}`"))),
        None => return Err(bad(format!("`__metadata__` has no field `block` (it must be `{META_BLOCK}`)"))),
    }
    match meta("scale") {
        Some(META_SCALE) => {}
        Some(v) => return Err(bad(format!("`__metadata__` field `scale` is `{v}`, not `{META_SCALE}`"))),
        None => return Err(bad(format!("`__metadata__` has no field `scale` (it must be `{META_SCALE}`)"))),
    }
    for t in tensors {
        if t.shape.len() == 2 && t.dtype != width.dtype() {
            return Err(bad(format!(
                "tensor `{}`: field `dtype` is {} but a {format} file stores every 2-D tensor as {}",
                t.name, t.dtype, width.dtype())));
        }
        // Belt and braces: the entry parser already refused these.
        if t.dtype.is_quantized() {
            if let Some(p) = shape_problem(t.dtype, &t.shape) {
                return Err(bad(format!("tensor `{}`: {p}", t.name)));
            }
            if t.dtype.tensor_bytes(&t.shape) != Some(t.len) {
                return Err(bad(format!("tensor `{}`: field `data_offsets` covers {} bytes, which disagrees with shape {:?}",
                    t.name, t.len, t.shape)));
            }
        }
    }
    Ok(Some(width))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Must;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("waste-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).must();
        d
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).must().map(|e| e.must().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn temporary_files_are_unique_and_removed_unless_committed() {
        let dir = scratch("tempfile");
        let dst = dir.join("x.bin");
        let a = TempFile::create(&dst).must();
        let mut b = TempFile::create(&dst).must();
        assert_ne!(a.temp_path(), b.temp_path(), "two writers of one file share a temporary name");
        b.file().write_all(b"b").must();
        drop(a);
        assert_eq!(names(&dir).len(), 1, "a dropped temporary file stays: {:?}", names(&dir));
        b.commit().must();
        assert_eq!(names(&dir), ["x.bin"]);
        assert_eq!(std::fs::read(&dst).must(), b"b");
        // A writer dropped half-way (an error on the way out) leaves nothing.
        let spec = TensorSpec { name: "t".into(), dtype: DType::F32, shape: vec![4] };
        for unique in [false, true] {
            let m = dir.join("m.safetensors");
            let specs = std::slice::from_ref(&spec);
            let mut w = if unique { Writer::create_unique(&m, specs, &[]) } else { Writer::create(&m, specs, &[]) }.must();
            w.write(&[0u8; 8]).must();
            drop(w);
            assert_eq!(names(&dir), ["x.bin"], "unique {unique}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A writer killed inside its write leaves `.NAME.PID.N.tmp`; the next write of the same
    /// destination removes it once its process is gone, and nothing else: not a live process's
    /// (another writer still at work), not this process's, not another destination's, not a
    /// name of another form.
    #[test]
    fn the_next_write_sweeps_temporary_files_of_dead_writers_only() {
        let dir = scratch("sweep");
        let dst = dir.join("usage.waste");
        // A process that has exited (reaped: its id names no process now).
        let dead = std::process::Command::new("true").spawn().must();
        let dead_pid = dead.id();
        let mut dead = dead;
        dead.wait().must();
        if crate::sys::process_exists(dead_pid) {
            println!("SKIP: the exited child's pid {dead_pid} was reused at once");
            return;
        }
        let mut live = std::process::Command::new("sleep").arg("30").spawn().must();
        let (own, other) = (std::process::id(), live.id());
        let stale = [format!(".usage.waste.{dead_pid}.0.tmp"), format!(".usage.waste.{dead_pid}.17.tmp")];
        let kept = [
            format!(".usage.waste.{own}.3.tmp"),
            format!(".usage.waste.{other}.0.tmp"),
            format!(".other.waste.{dead_pid}.0.tmp"),
            format!(".usage.waste.{dead_pid}.0.tmp.keep"),
            format!(".usage.waste.0{dead_pid}.0.tmp"),
            format!(".usage.waste.{dead_pid}.tmp"),
            format!(".usage.waste.x.{dead_pid}.0.tmp"),
            format!("usage.waste.{dead_pid}.0.tmp"),
        ];
        for n in stale.iter().chain(&kept) {
            std::fs::write(dir.join(n), b"torn").must();
        }
        // A directory of the pattern is not a file a writer left.
        std::fs::create_dir(dir.join(format!(".usage.waste.{dead_pid}.5.tmp"))).must();
        write_atomic(&dst, b"new").must();
        let _ = live.kill();
        let _ = live.wait();
        let mut want: Vec<String> = kept.to_vec();
        want.push(format!(".usage.waste.{dead_pid}.5.tmp"));
        want.push("usage.waste".into());
        want.sort();
        assert_eq!(names(&dir), want);
        assert_eq!(std::fs::read(&dst).must(), b"new");
        assert_eq!(temp_writer_pid(".a.b.12.3.tmp", "a.b"), Some(12));
        assert_eq!(temp_writer_pid(".a.b.12.3.tmp", "a"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn errors_name_the_destination_not_the_temporary_file() {
        let e = write_atomic(Path::new("/nonexistent-dir-of-waste/x.f32"), b"1234").unwrap_err().to_string();
        assert!(e.contains("/nonexistent-dir-of-waste/x.f32: cannot create"), "{e}");
        assert!(!e.contains(".tmp"), "{e}");
    }
}

//! Helpers of the quantized-checkpoint tests: checkpoints written from values, raw safetensors
//! files with hand-made headers, a deterministic generator, and an independent reading of the
//! seed's block formulas (written from the seed's text, not from `src/format/quant.rs`, so the
//! tests check the library against the specification rather than against itself).
#![allow(dead_code)]

use std::path::Path;
use waste::format::config::ModelConfig;
use waste::format::dtype::DType;
use waste::format::json;
use waste::format::safetensors::{TensorSpec, Writer};

pub use crate::common::Rng;

/// One tensor to write: name, stored dtype, shape, values.
pub struct T {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub values: Vec<f32>,
}

fn encode(dtype: DType, v: f32, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes()),
        DType::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes()),
        other => panic!("cannot write {other}"),
    }
}

/// Writes `path` (a .safetensors file) with the float tensors `ts`, in order.
pub fn write_tensors(path: &Path, ts: &[T], metadata: &[(String, String)]) {
    let specs: Vec<TensorSpec> = ts.iter().map(|t| TensorSpec { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone() }).collect();
    let mut w = Writer::create(path, &specs, metadata).unwrap();
    for t in ts {
        let mut bytes = Vec::new();
        for &v in &t.values {
            encode(t.dtype, v, &mut bytes);
        }
        w.write(&bytes).unwrap();
    }
    w.finish().unwrap();
}

/// Writes a raw safetensors file: the header text as given, then `data`.
pub fn write_raw(path: &Path, header: &str, data: &[u8]) {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    std::fs::write(path, b).unwrap();
}

/// Shape of a checkpoint of `config` (the engine's own tensor list).
pub fn shapes(config: &str) -> Vec<(String, Vec<u64>)> {
    let j = json::parse(config.as_bytes()).unwrap();
    let cfg = ModelConfig::from_json(Path::new("config.json"), &j).unwrap();
    waste::tools::random::tensor_shapes(&cfg)
}

/// The gate checkpoint (seed 000, "The gate weights are exact in the block format"): every
/// matrix block of 32 holds integers in −levels..=levels with one ±levels, so the block scale is
/// exactly 1 and the quantized file holds the very same weights; norm weights are `norm` ×
/// (1 ± 25 %) so that activations stay of order one.
pub fn exact_checkpoint(dir: &Path, config: &str, levels: i32, norm: f32, dtype: DType, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config).unwrap();
    let mut rng = Rng(seed);
    let ts: Vec<T> = shapes(config)
        .into_iter()
        .map(|(name, shape)| {
            let n: u64 = shape.iter().product();
            let values: Vec<f32> = if shape.len() == 2 {
                let mut v: Vec<f32> = (0..n).map(|_| rng.int(-levels, levels) as f32).collect();
                for block in v.chunks_exact_mut(32) {
                    let at = (rng.next() % 32) as usize;
                    block[at] = if rng.next() & 1 == 0 { levels as f32 } else { -levels as f32 };
                }
                v
            } else {
                (0..n).map(|_| norm * (0.75 + 0.5 * rng.unit())).collect()
            };
            T { name, dtype: if shape.len() == 2 { dtype } else { DType::F32 }, shape, values }
        })
        .collect();
    write_tensors(&dir.join("model.safetensors"), &ts, &[]);
}

/// A SmolLM2-like development shape with every dimension a multiple of 32 (tied embeddings).
pub const SMOL_TINY: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": true,
    "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2}"#;

// ---- The seed's formulas, read independently -------------------------------------------

/// Seed 000, "The scale": f32_to_f16(max|w| / levels), as binary16 bits.
pub fn seed_scale(block: &[f32], levels: f32) -> u16 {
    let m = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    half::f16::from_f32(m / levels).to_bits()
}

/// Seed 000: q = round(w / f16_to_f32(scale)), clamped; ties away from zero (documented choice).
pub fn seed_level(w: f32, scale_bits: u16, lo: f32, hi: f32) -> i32 {
    let s = half::f16::from_bits(scale_bits).to_f32();
    if s == 0.0 {
        return 0;
    }
    (w / s).round().clamp(lo, hi) as i32
}

/// The Q8B32 bytes of one row by the seed's text.
pub fn seed_q8_row(row: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in row.chunks_exact(32) {
        let s = seed_scale(b, 127.0);
        out.extend_from_slice(&s.to_le_bytes());
        out.extend(b.iter().map(|&w| seed_level(w, s, -128.0, 127.0) as i8 as u8));
    }
    out
}

/// The Q4B32 bytes of one row by the seed's text (nibble n: low = even position).
pub fn seed_q4_row(row: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in row.chunks_exact(32) {
        let s = seed_scale(b, 7.0);
        out.extend_from_slice(&s.to_le_bytes());
        for pair in b.chunks_exact(2) {
            let lo = seed_level(pair[0], s, -8.0, 7.0) as u8 & 0x0f;
            let hi = seed_level(pair[1], s, -8.0, 7.0) as u8 & 0x0f;
            out.push(lo | hi << 4);
        }
    }
    out
}

/// Dequantizes one row of blocks (the seed's decode: `(nibble ^ 8) - 8`, `q * scale`), in f64.
pub fn seed_dequant_row(row: &[u8], bits: u32) -> Vec<f64> {
    let bb = if bits == 4 { 18 } else { 34 };
    let mut out = Vec::new();
    for b in row.chunks_exact(bb) {
        let s = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32() as f64;
        for n in 0..32 {
            let q = if bits == 4 {
                let nib = (b[2 + n / 2] >> (4 * (n % 2))) & 0x0f;
                ((nib ^ 8) as i32) - 8
            } else {
                b[2 + n] as i8 as i32
            };
            out.push(q as f64 * s);
        }
    }
    out
}

/// The bytes of tensor `name` in a safetensors file.
pub fn tensor_bytes(path: &Path, name: &str) -> Vec<u8> {
    let st = waste::format::safetensors::SafeTensors::open(path).unwrap();
    let t = st.get(name).unwrap().clone();
    let mut buf = vec![0u8; t.len as usize];
    st.read_into(&t, &mut buf).unwrap();
    buf
}

/// The entries of a zip archive whose members are stored (no compression), as numpy's
/// `savez` writes them: (name, bytes). Zip64 local headers (sizes 0xFFFFFFFF, the real ones in
/// extra field 0x0001) are followed.
pub fn read_stored_zip(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) as u64;
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 30 <= bytes.len() && u32_at(at) == 0x0403_4b50 {
        let flags = u16_at(at + 6);
        let method = u16_at(at + 8);
        assert_eq!(method, 0, "member at {at} is compressed (method {method}); only stored members are read");
        assert_eq!(flags & 0x08, 0, "member at {at} uses a data descriptor");
        let mut size = u32_at(at + 18);
        let (name_len, extra_len) = (u16_at(at + 26), u16_at(at + 28));
        let name = String::from_utf8(bytes[at + 30..at + 30 + name_len].to_vec()).unwrap();
        let extra = &bytes[at + 30 + name_len..at + 30 + name_len + extra_len];
        if size == 0xffff_ffff {
            let mut e = 0;
            while e + 4 <= extra.len() {
                let (id, len) = (u16::from_le_bytes([extra[e], extra[e + 1]]), u16::from_le_bytes([extra[e + 2], extra[e + 3]]) as usize);
                if id == 1 {
                    // Zip64: uncompressed size, then compressed size (equal for stored members).
                    size = u64_at(at + 30 + name_len + e + 4);
                }
                e += 4 + len;
            }
        }
        let start = at + 30 + name_len + extra_len;
        out.push((name, bytes[start..start + size as usize].to_vec()));
        at = start + size as usize;
    }
    out
}

/// A `.npy` array: (dtype descr, shape, raw data).
pub fn parse_npy(b: &[u8]) -> (String, Vec<usize>, Vec<u8>) {
    assert_eq!(&b[..6], b"\x93NUMPY");
    let (hlen, start) = if b[6] == 1 { (u16::from_le_bytes([b[8], b[9]]) as usize, 10) } else { (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12) };
    let header = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{header}");
    let d = header.find("'descr': '").unwrap() + 10;
    let descr = header[d..d + header[d..].find('\'').unwrap()].to_string();
    let shape_txt = &header[header.find('(').unwrap() + 1..header.find(')').unwrap()];
    let shape = shape_txt.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().unwrap()).collect();
    (descr, shape, b[start + hlen..].to_vec())
}

pub fn f32s(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

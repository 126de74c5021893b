//! Rotary position embeddings (spec §0.5): the inverse frequencies with their scaling (Llama 3,
//! linear, YaRN), and the half-split and interleaved rotations applied to each head of q and k.

use crate::format::config::{RopeConfig, RopeScaling};

/// Inverse frequencies, one per rotated pair, bit for bit as the reference computes them.
///
/// The reference works on f32 tensors one operation at a time (spec §0.5), and at long positions
/// a one-ulp difference in a frequency moves the angle t·inv by ~1e-5 rad, enough to show in the
/// logits. So: base^(2j/d) rounded to f32, then its f32 reciprocal (two roundings, not one), and
/// the scaling in f32 with the reference's operation order.
pub fn inv_freq(rope: &RopeConfig) -> Vec<f32> {
    if let RopeScaling::Yarn { factor, original_max, beta_fast, beta_slow, truncate } = rope.scaling {
        return yarn(rope, factor, original_max, beta_fast, beta_slow, truncate);
    }
    let base = rope.theta as f32 as f64;
    (0..rope.dim / 2)
        .map(|j| {
            let exponent = (2 * j) as f32 / rope.dim as f32;
            let inv = 1.0 / (base.powf(exponent as f64) as f32);
            match rope.scaling {
                RopeScaling::None => inv,
                RopeScaling::Linear { factor } => inv / factor as f32,
                RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max } => {
                    llama3(inv, factor, low_freq_factor, high_freq_factor, original_max)
                }
                RopeScaling::Yarn { .. } => inv,
            }
        })
        .collect()
}

/// Llama 3 band scaling of one frequency (spec §0.5). The scalar parameters are combined in f64
/// and rounded once (as the reference's Python floats are); each tensor operation rounds to f32,
/// and `c / x` is evaluated as `(1 / x) · c`, as torch does for a scalar numerator.
fn llama3(inv: f32, factor: f64, lo: f64, hi: f64, original_max: f64) -> f32 {
    let low_freq_wavelen = (original_max / lo) as f32;
    let high_freq_wavelen = (original_max / hi) as f32;
    let wavelen = (1.0 / inv) * std::f64::consts::TAU as f32;
    let factor32 = factor as f32;
    if wavelen > low_freq_wavelen {
        inv / factor32
    } else if wavelen < high_freq_wavelen {
        inv
    } else {
        let smooth = ((1.0 / wavelen) * original_max as f32 - lo as f32) / (hi - lo) as f32;
        (1.0 - smooth) * inv / factor32 + smooth * inv
    }
}

/// YaRN frequencies (spec §0.5), in the reference's operation order: `base^(2j/d)` in f32, its
/// reciprocal (extrapolation) and that of `factor ×` it (interpolation), blended by a linear ramp
/// between the correction dimensions of `beta_fast` and `beta_slow` (Python floats, floored and
/// ceiled when `truncate`), every tensor operation rounding to f32.
fn yarn(rope: &RopeConfig, factor: f64, original_max: f64, beta_fast: f64, beta_slow: f64, truncate: bool) -> Vec<f32> {
    let (d, base) = (rope.dim, rope.theta);
    let corr = |rotations: f64| (d as f64 * (original_max / (rotations * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln());
    let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min((d as f64) - 1.0));
    if low == high {
        high += 0.001; // the reference's guard against a zero-width ramp
    }
    let span = (high - low) as f32;
    (0..d / 2)
        .map(|j| {
            let exponent = (2 * j) as f32 / d as f32;
            let pos_freq = (base as f32 as f64).powf(exponent as f64) as f32;
            let extrapolation = 1.0 / pos_freq;
            let interpolation = 1.0 / (factor as f32 * pos_freq);
            let ramp = ((j as f32 - low as f32) / span).clamp(0.0, 1.0);
            let extrapolation_factor = 1.0 - ramp;
            interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
        })
        .collect()
}

/// Fills `cos` and `sin` (each `inv_freq.len()` long) for position `pos`. The angle is the f32
/// product, as in the reference (visible at long positions).
pub fn angles(inv_freq: &[f32], pos: usize, cos: &mut [f32], sin: &mut [f32]) {
    for (j, &f) in inv_freq.iter().enumerate() {
        let theta = (pos as f32) * f;
        let (s, c) = (theta as f64).sin_cos();
        cos[j] = c as f32;
        sin[j] = s as f32;
    }
}

/// Rotates one head in place, half-split layout: pairs (x[j], x[j + d/2]) for the first `d`
/// channels (`d = 2 × cos.len()`); channels past `d` pass through.
pub fn rotate_half(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for j in 0..half {
        let (a, b) = (x[j], x[j + half]);
        x[j] = a * cos[j] - b * sin[j];
        x[j + half] = b * cos[j] + a * sin[j];
    }
}

/// Rotates one head in place, interleaved layout (GPT-J, DeepSeek): pairs (x[2j], x[2j + 1]).
/// The reference's V3 code writes the rotated evens then odds (a permutation shared by q and k,
/// spec §0.5); keeping the pairs in place gives the same dot products.
pub fn rotate_pairs(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (j, pair) in x.chunks_exact_mut(2).take(cos.len()).enumerate() {
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * cos[j] - b * sin[j];
        pair[1] = b * cos[j] + a * sin[j];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(rope: &RopeConfig) -> Vec<u32> {
        inv_freq(rope).iter().map(|f| f.to_bits()).collect()
    }

    fn llama3(original_max: f64, dim: usize) -> RopeConfig {
        RopeConfig { theta: 5e5, dim, scaling: RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max } }
    }

    /// Bit patterns of transformers 5.24.0's `LlamaRotaryEmbedding.inv_freq` (torch 2.15, CPU)
    /// for the same parameters.
    #[test]
    fn frequencies_are_the_reference_bits() {
        let plain = RopeConfig { theta: 1e4, dim: 16, scaling: RopeScaling::None };
        assert_eq!(bits(&plain), [0x3f800000, 0x3ea1e89b, 0x3dcccccd, 0x3d0186e3, 0x3c23d70a, 0x3b4f3e38, 0x3a83126f, 0x39a5cb60]);
        // Every pair of this one is in a scaled band; the first ones in the smoothed band.
        assert_eq!(bits(&llama3(16.0, 16)), [0x3f13786e, 0x3cc693b0, 0x3b9a08c8, 0x3a6ef74f, 0x39395d21, 0x380fc8f8, 0x36df10c4, 0x35ad07a7]);
        // Llama 3.1's own scaling: pairs 29..=35 are smoothed.
        let real = bits(&llama3(8192.0, 128));
        let expect = [(0, 0x3f800000), (20, 0x3c87a9c3), (28, 0x3b527720), (29, 0x3b0dfd06), (30, 0x3ab3d11d), (31, 0x3a60979e),
            (32, 0x3a0995d2), (33, 0x39a3f108), (34, 0x393b2dd2), (35, 0x38c86886), (36, 0x38a3418d), (63, 0x34a4c2ff)];
        for (j, b) in expect {
            assert_eq!(real[j], b, "pair {j}: {} vs {}", f32::from_bits(real[j]), f32::from_bits(b));
        }
    }

    fn yarn(dim: usize, factor: f64, original_max: f64) -> RopeConfig {
        RopeConfig { theta: 1e4, dim, scaling: RopeScaling::Yarn { factor, original_max, beta_fast: 32.0, beta_slow: 1.0, truncate: true } }
    }

    /// Bit patterns of transformers 5.24.0's `_compute_yarn_parameters` (torch 2.15, CPU) for
    /// DeepseekV3Config with the same rope_parameters: the fixtures' tiny shapes (factor 40 over
    /// 8 positions, factor 4 over 128) and DeepSeek-V3's own (d_r 64, factor 40 over 4096).
    #[test]
    fn yarn_frequencies_are_the_reference_bits() {
        assert_eq!(bits(&yarn(8, 40.0, 8.0)), [0x3f800000, 0x3b23d70a, 0x3983126f, 0x37d1b717]);
        assert_eq!(bits(&yarn(8, 4.0, 128.0)), [0x3f800000, 0x3d800000, 0x3b23d70a, 0x3983126f]);
        let v3 = bits(&yarn(64, 40.0, 4096.0));
        for (j, b) in [(0, 0x3f800000), (5, 0x3e72d423), (10, 0x3d6655c2), (11, 0x3d1fc5ba), (12, 0x3cdc321b), (15, 0x3c088d77),
            (20, 0x3a4f3e37), (25, 0x379d43a3), (31, 0x365fba4f)] {
            assert_eq!(v3[j], b, "pair {j}: {} vs {}", f32::from_bits(v3[j]), f32::from_bits(b));
        }
    }

    #[test]
    fn interleaved_rotation_turns_each_pair() {
        let mut x = [1.0f32, 0.0, 0.0, 2.0, 5.0];
        rotate_pairs(&mut x, &[0.0, 1.0], &[1.0, 0.0]);
        // Pair 0 turns by 90 degrees, pair 1 by 0; the odd channel past 2·len(cos) is left alone.
        assert_eq!(x, [0.0, 1.0, 0.0, 2.0, 5.0]);
    }
}

//! Rotary position embeddings (spec §0.5): the inverse frequencies with their scaling, and the
//! half-split rotation applied to each head of q and k.

use crate::format::config::{RopeConfig, RopeScaling};

/// Inverse frequencies, one per rotated pair, rounded to f32 as the reference computes them.
pub fn inv_freq(rope: &RopeConfig) -> Vec<f32> {
    let d = rope.dim as f64;
    (0..rope.dim / 2)
        .map(|j| {
            // The reference raises base to (2j/d) in f32: round the exponent like it does.
            let exponent = ((2 * j) as f32 / rope.dim as f32) as f64;
            let inv = (1.0 / rope.theta.powf(exponent)) as f32 as f64;
            let scaled = match rope.scaling {
                RopeScaling::None => inv,
                RopeScaling::Linear { factor } => inv / factor,
                RopeScaling::Llama3 { factor, low_freq_factor: lo, high_freq_factor: hi, original_max: l } => {
                    let wavelen = 2.0 * std::f64::consts::PI / inv;
                    if wavelen > l / lo {
                        inv / factor
                    } else if wavelen < l / hi {
                        inv
                    } else {
                        let smooth = (l / wavelen - lo) / (hi - lo);
                        (1.0 - smooth) * inv / factor + smooth * inv
                    }
                }
            };
            let _ = d;
            scaled as f32
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

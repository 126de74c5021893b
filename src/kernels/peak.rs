//! Arithmetic peaks for `bench matmul`: loops of independent multiply-adds that keep every
//! multiply pipe busy, per instruction set — the f32 fused multiply-add the kernels use, and
//! the integer multiply-adds of the int8 path (`vpmaddubsw` on AVX2, `vpdpbusd` with AVX-512
//! VNNI) and of the int16 path (`vpmaddwd` on AVX2, `vpdpwssd` with AVX-VNNI or AVX-512
//! VNNI). Each returns its multiply-adds (lane products) and a value to keep the loop alive;
//! the figures are printed, never asserted.
//!
//! Twelve accumulators hide the instructions' latency (4 cycles at up to 2 per cycle on the
//! cores measured here: at least 8 independent chains are needed).

use super::{Int8Isa, Isa};

/// Chains of the loops.
const CHAINS: usize = 12;

/// Runs `iters` rounds of the f32 multiply-add loop of `isa`; returns the multiply-adds done.
pub fn fma(isa: Isa, iters: usize) -> u64 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's kernels were chosen for an instruction set this CPU has.
        Isa::Avx2 if isa.supported() => unsafe { x86::fma_avx2(iters) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512 | Isa::Amx if isa.supported() => unsafe { x86::fma_avx512(iters) },
        _ => fma_scalar(iters),
    }
}

/// Runs `iters` rounds of the integer multiply-add loop of the int8 path `isa`; returns the
/// (byte × byte) multiply-adds done.
pub fn int8(isa: Int8Isa, iters: usize) -> u64 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in [`fma`].
        Int8Isa::Avx2 if isa.supported() => unsafe { x86::maddubs_avx2(iters) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in [`fma`].
        Int8Isa::Avx512Vnni if isa.supported() => unsafe { x86::dpbusd_avx512(iters) },
        _ => int8_scalar(iters),
    }
}

/// Runs `iters` rounds of the integer multiply-add loop of the int16 path on `isa`'s kernels;
/// returns the (16-bit × 16-bit) multiply-adds done.
pub fn int16(isa: Int8Isa, iters: usize) -> u64 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in [`fma`].
        Int8Isa::Avx512Vnni if isa.supported() => unsafe { x86::dpwssd_avx512(iters) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in [`fma`]; AVX-VNNI was checked.
        Int8Isa::Avx2 if super::has_avx_vnni() => unsafe { x86::dpwssd_avxvnni(iters) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in [`fma`].
        Int8Isa::Avx2 if isa.supported() => unsafe { x86::maddwd_avx2(iters) },
        _ => int8_scalar(iters),
    }
}

fn fma_scalar(iters: usize) -> u64 {
    let mut a = [1.0f32; CHAINS];
    for _ in 0..iters {
        for v in a.iter_mut() {
            *v = v.mul_add(0.999_999, 1e-7);
        }
    }
    std::hint::black_box(a);
    (iters * CHAINS) as u64
}

fn int8_scalar(iters: usize) -> u64 {
    let mut a = [1i32; CHAINS];
    for i in 0..iters {
        for (k, v) in a.iter_mut().enumerate() {
            *v = v.wrapping_add(((i + k) as u8 as i32) * -3);
        }
    }
    std::hint::black_box(a);
    (iters * CHAINS) as u64
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn fma_avx2(iters: usize) -> u64 {
        let mut a = [_mm256_set1_ps(1.0); CHAINS];
        let (m, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = _mm256_fmadd_ps(*v, m, c);
            }
        }
        std::hint::black_box(a);
        (iters * CHAINS * 8) as u64
    }

    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn fma_avx512(iters: usize) -> u64 {
        let mut a = [_mm512_set1_ps(1.0); CHAINS];
        let (m, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = _mm512_fmadd_ps(*v, m, c);
            }
        }
        std::hint::black_box(a);
        (iters * CHAINS * 16) as u64
    }

    /// `vpmaddubsw`: 32 byte products summed in pairs per instruction (the int8 path's AVX2
    /// multiply; its `vpmaddwd` widening is counted as overhead, not as multiply-adds).
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn maddubs_avx2(iters: usize) -> u64 {
        let mut a = [_mm256_set1_epi8(1); CHAINS];
        let w = _mm256_set1_epi8(3);
        for _ in 0..iters {
            for v in a.iter_mut() {
                // The result feeds the next round as the unsigned operand: a dependent chain
                // per accumulator, as in the kernels.
                *v = _mm256_maddubs_epi16(*v, w);
            }
        }
        std::hint::black_box(a);
        (iters * CHAINS * 32) as u64
    }

    /// `vpdpbusd` on 512-bit registers: 64 byte products per instruction.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    pub unsafe fn dpbusd_avx512(iters: usize) -> u64 {
        let mut a = [_mm512_setzero_si512(); CHAINS];
        let (u, w) = (_mm512_set1_epi8(7), _mm512_set1_epi8(-3));
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, u, w);
            }
        }
        std::hint::black_box(a);
        (iters * CHAINS * 64) as u64
    }

    /// `vpmaddwd` + `vpaddd`: 16 products of 16-bit integers per pair of instructions (the
    /// int16 path's AVX2 multiply-add).
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn maddwd_avx2(iters: usize) -> u64 {
        let mut a = [_mm256_setzero_si256(); CHAINS];
        let w = _mm256_set1_epi16(-3);
        for _ in 0..iters {
            for v in a.iter_mut() {
                // The accumulator is also a factor: a dependent chain the compiler cannot hoist.
                *v = _mm256_add_epi32(*v, _mm256_madd_epi16(*v, w));
            }
        }
        std::hint::black_box(a);
        (iters * CHAINS * 16) as u64
    }

    /// AVX-VNNI `vpdpwssd` on 256-bit registers: 16 products of 16-bit integers per
    /// instruction.
    ///
    /// # Safety
    /// The CPU has AVX2 and AVX-VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn dpwssd_avxvnni(iters: usize) -> u64 {
        let mut a = [_mm256_setzero_si256(); CHAINS];
        let (u, w) = (_mm256_set1_epi16(7), _mm256_set1_epi16(-3));
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = _mm256_dpwssd_avx_epi32(*v, u, w);
            }
        }
        std::hint::black_box(a);
        (iters * CHAINS * 16) as u64
    }

    /// `vpdpwssd` on 512-bit registers: 32 products of 16-bit integers per instruction.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn dpwssd_avx512(iters: usize) -> u64 {
        let mut a = [_mm512_setzero_si512(); CHAINS];
        let (u, w) = (_mm512_set1_epi16(7), _mm512_set1_epi16(-3));
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = _mm512_dpwssd_epi32(*v, u, w);
            }
        }
        std::hint::black_box(a);
        (iters * CHAINS * 32) as u64
    }
}

//! Per-CPU choices of the x86 kernels that change only when bytes move, never the bits: where
//! the decode tiles prefetch ([`Prefetch`]) and how the AVX-512 prefill GEMM groups a chunk's
//! vectors ([`TokenGroups`]). Each is picked by CPU vendor where it was measured, and `waste
//! bench matmul` can force either value so that another host can be measured; tests check
//! that every value gives the same bits (`tests/kernels.rs`).

/// Where the decode tiles (one vector, or the few of an expert) ask for the weight
/// lines ahead of them. Only when bytes arrive changes: both give the same bits
/// (`tests/kernels.rs`). Which is faster depends on the CPU's own prefetchers, so
/// [`super::Kernels::select`] picks by vendor ([`Prefetch::for_this_cpu`]) and `waste bench matmul
/// --prefetch` measures either (BENCHMARKS, 2026-12-04 afternoon).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// Each block step asks for its share of the tile after next, to L2. AMD: Q8B32 decode
    /// +10 % over one tile ahead on Zen 4, Q4B32 +20 % on Zen 3 (AVX2).
    TileAfterNext,
    /// Each block step asks for a line 48 steps ahead in the tile's own rows, to L1. On an
    /// Intel Xeon (family 6 model 167), 1 GiB from DRAM on two threads: Q4B32 decode 57 → 82 %
    /// and Q8B32 70 → 95 % of the read bandwidth, where the tile after next did no better than
    /// no prefetch (its AVX2 tiles: Q8B32 67–73 → 88–97 %, Q4B32 level); from L3 (a matrix
    /// that fits it) about 10 % slower than the tile after next. The AVX-512 dense tiles
    /// (F32, BF16, F16) ask for a line a fixed distance ahead in their own rows (their
    /// `DENSE_OWN_ROWS_AHEAD`, with its measurements).
    OwnRows,
}

impl Prefetch {
    /// Both schemes.
    pub const ALL: [Prefetch; 2] = [Prefetch::TileAfterNext, Prefetch::OwnRows];

    /// The scheme's name, as `--prefetch` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Prefetch::TileAfterNext => "tile-after-next",
            Prefetch::OwnRows => "own-rows",
        }
    }

    /// Parses a name as printed by [`Prefetch::name`].
    pub fn from_name(name: &str) -> Option<Prefetch> {
        Prefetch::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The scheme measured best on this CPU's vendor: [`Prefetch::OwnRows`] on Intel,
    /// [`Prefetch::TileAfterNext`] elsewhere (AMD, where it was measured, and any CPU not
    /// measured).
    pub fn for_this_cpu() -> Prefetch {
        if crate::sys::cpu_vendor() == *b"GenuineIntel" { Prefetch::OwnRows } else { Prefetch::TileAfterNext }
    }
}

/// How the AVX-512 prefill GEMM groups a chunk's vectors. Its panel of widened weights serves
/// one group at a time, and the group's inputs are read again for every panel, so the choice is
/// between widening each panel once per chunk with the inputs coming from L3, and widening it
/// once per group of inputs that stay in L2. Only the order of the work changes: each (row,
/// vector) pair takes the same fused multiply-adds, so both give the same bits
/// (`tests/kernels.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenGroups {
    /// As many vectors as fit 1 MiB of inputs (at least 16): on an Intel Xeon (family 6 model
    /// 167, 2 MiB L2, a mesh L3), a C replica of the loop ran at 80 % of the FMA peak with 1 MiB
    /// of inputs against 58 % with 4 MiB (BENCHMARKS, 2026-12-04).
    FitL2,
    /// The whole chunk (up to 128 vectors), each panel widened once: on AMD Zen 4 (1 MiB L2, a
    /// 32 MiB L3 close to the core) 2,048 × 8,192 products of 128 vectors ran at 82 % of the
    /// FMA peak against 63 % with 1 MiB groups (BF16; Q8B32 83 against 71 %), a 1B prefill
    /// 1–9 % faster (BENCHMARKS, 2026-12-05).
    Whole,
}

impl TokenGroups {
    /// Both rules.
    pub const ALL: [TokenGroups; 2] = [TokenGroups::FitL2, TokenGroups::Whole];

    /// The rule's name, as `--token-groups` takes it.
    pub fn name(self) -> &'static str {
        match self {
            TokenGroups::FitL2 => "fit-l2",
            TokenGroups::Whole => "whole",
        }
    }

    /// Parses a name as printed by [`TokenGroups::name`].
    pub fn from_name(name: &str) -> Option<TokenGroups> {
        TokenGroups::ALL.into_iter().find(|g| g.name() == name)
    }

    /// The rule measured best on this CPU's vendor: [`TokenGroups::Whole`] on AMD, where it was
    /// measured, [`TokenGroups::FitL2`] elsewhere (Intel, where the smaller groups were measured
    /// better, and any CPU not measured).
    pub fn for_this_cpu() -> TokenGroups {
        if crate::sys::cpu_vendor() == *b"AuthenticAMD" { TokenGroups::Whole } else { TokenGroups::FitL2 }
    }
}

/// Whether the default ([`crate::Activations::Auto`]) decodes Q4B32 with int21 activations on
/// AVX-512 VNNI kernels. On Intel, where it was measured (BENCHMARKS, 2026-12-06: the int21
/// form read 84–85 % of the read bandwidth from DRAM where the f32 tiles read 72–80 %, and a
/// Llama-1B-shaped decode ran 1.06–1.17× faster): yes. Elsewhere — AMD Zen 4, where the f32
/// Q4B32 decode is bound by its instructions and int21 should gain most, but which was not
/// measured since — not yet: f32.
pub fn avx512_int21_decode_for_this_cpu() -> bool {
    crate::sys::cpu_vendor() == *b"GenuineIntel"
}

//! Float-versus-quantized comparison behind `waste compare` (seed 000, "Producing and checking
//! a checkpoint"): two independent greedy decodes of one prompt, and the logit differences of
//! the two models measured on the *float* token sequence, so that every step compares the two
//! models on the same input.
//!
//! Definitions (the seed names the lines; these are our precise readings of them):
//! - `tokens_float` / `tokens_quant`: `n` greedy tokens from each model on its own (argmax,
//!   lowest id on ties; end-of-sequence tokens do not stop the decode, so both lists always
//!   have `n` entries and compare position by position).
//! - `logits`: the `n` next-token distributions the float decode chose from — after the
//!   prompt, then after each float token but the last — compared element-wise with the
//!   quantized model's logits for the same inputs: `steps = n`, `values = n × vocab`.
//! - `prefill`: the same difference for the first of those distributions alone (after the
//!   prompt, before any generated token).
//! - A NaN or infinite logit anywhere, in either model, fails the comparison whatever the
//!   tokens: argmax skips NaN, so two broken models could otherwise "agree".

use crate::error::{Error, Result};
use crate::Model;

/// The outcome of a comparison.
#[derive(Clone, Debug)]
pub struct CompareReport {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// The float model's greedy tokens.
    pub tokens_float: Vec<u32>,
    /// The quantized model's greedy tokens.
    pub tokens_quant: Vec<u32>,
    /// Decode steps compared.
    pub steps: usize,
    /// Logits compared in all (logits per step × steps).
    pub values: usize,
    /// Largest |float − quant| over every compared logit.
    pub max_diff: f64,
    /// Mean |float − quant| over them.
    pub mean_diff: f64,
    /// Largest |float − quant| over the distribution after the prompt alone.
    pub prefill_max: f64,
    /// Mean |float − quant| after the prompt.
    pub prefill_mean: f64,
    /// Non-finite logits seen from the float model (every distribution its decode computed).
    pub non_finite_float: usize,
    /// Non-finite logits from the quantized model.
    pub non_finite_quant: usize,
}

impl CompareReport {
    /// True when the two greedy decodes chose the same tokens.
    pub fn matches(&self) -> bool {
        self.tokens_float == self.tokens_quant
    }

    /// The first step at which the decodes differ.
    pub fn first_difference(&self) -> Option<usize> {
        self.tokens_float.iter().zip(&self.tokens_quant).position(|(a, b)| a != b)
    }

    /// True when every logit of both models was finite.
    pub fn finite(&self) -> bool {
        self.non_finite_float == 0 && self.non_finite_quant == 0
    }

    /// True when the comparison passes: finite logits and the same tokens.
    pub fn passed(&self) -> bool {
        self.finite() && self.matches()
    }

    /// The seed's `COMPARE` lines, ending with `COMPARE OK` when the tokens match and every
    /// logit is finite, `COMPARE FAIL non_finite …` when a logit is not, and
    /// `COMPARE FAIL step=…` when the tokens differ.
    pub fn lines(&self) -> Vec<String> {
        let ids = |v: &[u32]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" ");
        let mut out = vec![
            format!("COMPARE tokens_float {}", ids(&self.tokens_float)),
            format!("COMPARE tokens_quant {}", ids(&self.tokens_quant)),
            format!("COMPARE logits steps={} values={} max={:.6} mean={:.9}", self.steps, self.values, self.max_diff, self.mean_diff),
            format!("COMPARE prefill max={:.6} mean={:.9}", self.prefill_max, self.prefill_mean),
            format!("COMPARE result match={} tokens={} max_diff={:.6} mean_diff={:.9}",
                self.matches(), self.tokens_float.len(), self.max_diff, self.mean_diff),
        ];
        match self.first_difference() {
            _ if !self.finite() => out.push(format!("COMPARE FAIL non_finite float={} quant={}", self.non_finite_float, self.non_finite_quant)),
            None => out.push("COMPARE OK".to_string()),
            Some(i) => out.push(format!("COMPARE FAIL step={i} float={} quant={}", self.tokens_float[i], self.tokens_quant[i])),
        }
        out
    }
}

/// Running max and sum of |a − b|.
#[derive(Default)]
struct Diff {
    max: f64,
    sum: f64,
    count: usize,
}

impl Diff {
    fn add(&mut self, a: &[f32], b: &[f32]) {
        for (x, y) in a.iter().zip(b) {
            let d = (*x as f64 - *y as f64).abs();
            // A NaN difference must not hide: it makes the maximum NaN.
            self.max = if d.is_nan() || self.max.is_nan() { f64::NAN } else { self.max.max(d) };
            self.sum += d;
        }
        self.count += a.len();
    }

    fn mean(&self) -> f64 {
        self.sum / self.count.max(1) as f64
    }
}

fn non_finite(logits: &[f32]) -> usize {
    logits.iter().filter(|v| !v.is_finite()).count()
}

/// The id of the largest logit (lowest id on ties; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// Decodes `n` tokens greedily after `prompt` with both models and measures their logits on
/// the float token sequence. Both sessions are reset first and left holding the decodes.
pub fn compare(float: &mut Model, quant: &mut Model, prompt: &[u32], n: usize) -> Result<CompareReport> {
    if prompt.is_empty() {
        return Err(Error::arg("compare: the prompt has no tokens"));
    }
    if n == 0 {
        return Err(Error::arg("compare: -n must be at least 1"));
    }
    // The reference must be the floating point model: a quantized one on that side would
    // measure one quantization against another and call it the error. The one exception is a
    // quantized checkpoint compared with itself, which isolates the activation path (the
    // reference side always runs f32 activations; the other may use int8 ones).
    let (fi, qi) = (float.info(), quant.info());
    let same = fi.path == qi.path || matches!((fi.path.canonicalize(), qi.path.canonicalize()), (Ok(a), Ok(b)) if a == b);
    if let Some(d) = fi.dtypes.iter().find(|d| matches!(d.as_str(), "Q4B32" | "Q8B32")).filter(|_| !same) {
        return Err(Error::arg(format!(
            "compare: the float model {} is quantized ({d}); give the floating point checkpoint first, then the quantized one",
            fi.path.display())));
    }
    let (vf, vq) = (float.config().vocab, quant.config().vocab);
    if vf != vq {
        return Err(Error::arg(format!("compare: the float model has a vocabulary of {vf}, the quantized one {vq}")));
    }
    float.reset();
    quant.reset();
    let mut steps = Diff::default();
    let mut prefill = Diff::default();
    let mut tokens_float = Vec::with_capacity(n);
    let (mut bad_float, mut bad_quant) = (0, 0);
    for step in 0..n {
        let input: &[u32] = if step == 0 { prompt } else { &tokens_float[step - 1..step] };
        let input = input.to_vec();
        let lf = float.eval(&input)?;
        let lq = quant.eval(&input)?;
        bad_float += non_finite(lf);
        bad_quant += non_finite(lq);
        steps.add(lf, lq);
        if step == 0 {
            prefill.add(lf, lq);
        }
        tokens_float.push(argmax(lf));
    }
    quant.reset();
    let mut tokens_quant = Vec::with_capacity(n);
    let mut input = prompt.to_vec();
    while tokens_quant.len() < n {
        let lq = quant.eval(&input)?;
        bad_quant += non_finite(lq);
        let next = argmax(lq);
        tokens_quant.push(next);
        input = vec![next];
    }
    Ok(CompareReport {
        prompt: prompt.to_vec(),
        tokens_float,
        tokens_quant,
        steps: n,
        values: steps.count,
        max_diff: steps.max,
        mean_diff: steps.mean(),
        prefill_max: prefill.max,
        prefill_mean: prefill.mean(),
        non_finite_float: bad_float,
        non_finite_quant: bad_quant,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_lowest_id_on_ties_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.25]), 1);
    }

    #[test]
    fn lines_in_the_seed_shape() {
        let r = CompareReport {
            prompt: vec![1],
            tokens_float: vec![5, 6],
            tokens_quant: vec![5, 7],
            steps: 2,
            values: 8,
            max_diff: 0.5,
            mean_diff: 0.125,
            prefill_max: 0.25,
            prefill_mean: 0.0625,
            non_finite_float: 0,
            non_finite_quant: 0,
        };
        let l = r.lines();
        assert_eq!(l[0], "COMPARE tokens_float 5 6");
        assert_eq!(l[1], "COMPARE tokens_quant 5 7");
        assert_eq!(l[2], "COMPARE logits steps=2 values=8 max=0.500000 mean=0.125000000");
        assert_eq!(l[3], "COMPARE prefill max=0.250000 mean=0.062500000");
        assert_eq!(l[4], "COMPARE result match=false tokens=2 max_diff=0.500000 mean_diff=0.125000000");
        assert_eq!(l[5], "COMPARE FAIL step=1 float=6 quant=7");
        assert!(!r.matches());
        assert!(!r.passed());
    }

    #[test]
    fn non_finite_logits_fail_even_when_the_tokens_match() {
        let r = CompareReport {
            prompt: vec![1],
            tokens_float: vec![5, 5],
            tokens_quant: vec![5, 5],
            steps: 2,
            values: 8,
            max_diff: f64::NAN,
            mean_diff: f64::NAN,
            prefill_max: f64::NAN,
            prefill_mean: f64::NAN,
            non_finite_float: 0,
            non_finite_quant: 8,
        };
        assert!(r.matches() && !r.passed());
        let l = r.lines();
        assert_eq!(l.last().map(String::as_str), Some("COMPARE FAIL non_finite float=0 quant=8"));
        assert!(!l.iter().any(|x| x == "COMPARE OK"), "{l:?}");
        assert_eq!(non_finite(&[1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]), 3);
    }

    #[test]
    fn nan_differences_show_in_the_maximum() {
        let mut d = Diff::default();
        d.add(&[1.0, f32::NAN], &[1.5, 0.0]);
        d.add(&[0.0], &[2.0]);
        assert!(d.max.is_nan());
    }
}

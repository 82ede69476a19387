//! Reference of the `penalties` kernel: the sampler's repetition / presence / frequency penalties
//! and bans from a token-count array (the form the history takes on the GPU). Same arithmetic as
//! `engine::Sampler` (its tests check the two agree bit for bit).
//!
//! `counts[i]`: bit 31 set when token i was in the prompt (repetition penalty only), bits 0..30
//! how many times it was generated.

/// Bit 31 of a count: seen in the prompt.
pub const PROMPT_BIT: u32 = 0x8000_0000;

/// The penalty settings (1, 0, 0 = off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    pub repetition: f32,
    pub presence: f32,
    pub frequency: f32,
}

impl Penalties {
    /// Whether any penalty changes logits.
    pub fn active(&self) -> bool {
        (self.repetition != 1.0 && self.repetition > 0.0)
            || self.presence != 0.0
            || self.frequency != 0.0
    }
}

/// The count array of a sequence whose prompt is `prompt` (prompt tokens marked only when the
/// repetition penalty is on, as `engine::Sampler` does; ids outside the vocabulary ignored).
pub fn initial_counts(prompt: &[u32], vocab: usize, p: &Penalties) -> Vec<u32> {
    let mut c = vec![0u32; vocab];
    if p.repetition != 1.0 {
        for &t in prompt {
            if let Some(x) = c.get_mut(t as usize) {
                *x |= PROMPT_BIT;
            }
        }
    }
    c
}

/// Record a generated token.
pub fn count(counts: &mut [u32], id: u32) {
    if let Some(x) = counts.get_mut(id as usize) {
        *x = x.wrapping_add(1);
    }
}

/// Apply the penalties to `logits` in place, then set `banned` ids (in range) to -inf.
pub fn apply(logits: &mut [f32], counts: &[u32], p: &Penalties, banned: &[u32]) {
    let rep = p.repetition != 1.0 && p.repetition > 0.0;
    let additive = p.presence != 0.0 || p.frequency != 0.0;
    for (l, &c) in logits.iter_mut().zip(counts) {
        if c == 0 {
            continue;
        }
        if rep {
            *l = if *l > 0.0 {
                *l / p.repetition
            } else {
                *l * p.repetition
            };
        }
        let n = c & !PROMPT_BIT;
        if additive && n > 0 {
            *l -= p.presence + p.frequency * n as f32;
        }
    }
    for &b in banned {
        if let Some(l) = logits.get_mut(b as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_and_openai_definitions() {
        let p = Penalties {
            repetition: 2.0,
            presence: 0.5,
            frequency: 0.25,
        };
        let mut c = initial_counts(&[0, 1], 4, &p);
        count(&mut c, 2);
        count(&mut c, 2);
        count(&mut c, 9); // outside: ignored
        let mut l = [4.0f32, -4.0, 1.0, 1.0];
        apply(&mut l, &c, &p, &[3, 17]);
        assert_eq!(l, [2.0, -8.0, -0.5, f32::NEG_INFINITY]);
    }

    #[test]
    fn off_changes_nothing_and_prompt_is_unmarked() {
        let p = Penalties {
            repetition: 1.0,
            presence: 0.0,
            frequency: 0.0,
        };
        assert!(!p.active());
        let c = initial_counts(&[0, 1], 3, &p);
        assert_eq!(c, vec![0, 0, 0]);
        let mut l = [1.0f32, 2.0, 3.0];
        apply(&mut l, &[5, 5, 5], &p, &[]);
        assert_eq!(l, [1.0, 2.0, 3.0]);
    }
}

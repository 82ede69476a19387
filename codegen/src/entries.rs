//! The secondary entries of a kernel instance: besides its main `extern "C"` entry (the
//! instance's name), a template may define `<name>__<suffix>` entries (multi-row forms, fused
//! epilogues, helper passes). Each suffix is an [`Entry`]; the build reads which ones every
//! rendered instance defines ([`entries_of`]) and the registry lists them, so the runtime
//! resolves an entry by its variant and finds a missing one before it loads anything.

use crate::key::KeyParseError;
use std::fmt;
use std::str::FromStr;

crate::key::key_enum! {
    /// A secondary entry of a kernel instance, by its name suffix.
    "entry", pub enum Entry {
        Ban => "ban",
        Bf16 => "bf16",
        Count => "count",
        Down => "down",
        GatherBf16 => "gather_bf16",
        Glu => "glu",
        Glurs => "glurs",
        Gqa => "gqa",
        GqaMerge => "gqa_merge",
        K2 => "k2",
        Ks => "ks",
        Ks8 => "ks8",
        M64 => "m64",
        Mma => "mma",
        Mmaw => "mmaw",
        N256 => "n256",
        Norm => "norm",
        OneBlock => "one_block",
        Order => "order",
        Q8 => "q8",
        Qkvp => "qkvp",
        Res => "res",
        Rows4 => "rows4",
        Rows8 => "rows8",
        Rows16 => "rows16",
        Rs => "rs",
        Rs2 => "rs2",
        Rsqv => "rsqv",
        Rsqvw => "rsqvw",
        Rsw => "rsw",
        S2 => "s2",
        Scatter => "scatter",
        Vec => "vec",
        W8 => "w8",
        Warp4 => "warp4",
        Warp8 => "warp8",
        Warp16 => "warp16",
        Warp32 => "warp32",
        Wg => "wg",
        Wg256 => "wg256",
    }
}

/// The secondary entries `source` (the rendered instance `name`) defines, in order of first
/// definition; an `extern "C" __global__` entry `<name>__<suffix>` whose suffix is no [`Entry`]
/// is an error naming it.
pub fn entries_of(name: &str, source: &str) -> Result<Vec<Entry>, String> {
    let prefix = format!("{name}__");
    let mut out = Vec::new();
    for line in source.lines().filter(|l| l.contains("__global__")) {
        let mut rest = line;
        while let Some(at) = rest.find(&prefix) {
            let tail = &rest[at + prefix.len()..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let suffix = &tail[..end];
            let e: Entry = suffix.parse().map_err(|e: KeyParseError| {
                format!("{name}: entry `{prefix}{suffix}`: {e} (add it to codegen::entries::Entry)")
            })?;
            if !out.contains(&e) {
                out.push(e);
            }
            rest = &tail[end..];
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_from_the_definitions() {
        let src = "extern \"C\" __global__ void __launch_bounds__(256) k_sm_90a(\n\
                   extern \"C\" __global__ void __launch_bounds__(256) k_sm_90a__rs2(int a) {\n\
                   // k_sm_90a__glu is only mentioned here\n\
                   extern \"C\" __global__ void k_sm_90a__gqa_merge(\n";
        assert_eq!(
            entries_of("k_sm_90a", src).unwrap(),
            vec![Entry::Rs2, Entry::GqaMerge]
        );
        let bad = "extern \"C\" __global__ void k_sm_90a__nope(\n";
        let e = entries_of("k_sm_90a", bad).unwrap_err();
        assert!(e.contains("k_sm_90a__nope"), "{e}");
        for e in Entry::ALL {
            assert_eq!(e.as_str().parse::<Entry>().unwrap(), *e);
        }
    }

    /// The enum is exactly the set the templates define: every variant is some instance's.
    #[test]
    fn every_entry_is_defined_by_some_instance() {
        let all = crate::render_all(&crate::default_templates_dir()).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for (inst, src) in &all {
            seen.extend(entries_of(&inst.name(), src).unwrap());
        }
        for e in Entry::ALL {
            assert!(seen.contains(e), "no instance defines __{e}");
        }
    }
}

//! What the snapshot tests record (`codegen/tests/snapshots/`), shared by the tests and by
//! `cargo xtask gen-kernels` (which deletes snapshot files no instance produces any more).
//!
//! - Rendered sources: one snapshot per instance, except that the arches of one instance whose
//!   sources differ only in the arch's name (in the entry names and the header line) share one,
//!   named after all of them (`rmsnorm_f32_sm_90a+sm_121a`) with the arch written `{arch}`.
//! - PTX: the representative set (`ptx_snapshot = true`, sm_90a and sm_121a) in full, and one
//!   lock of every instance's PTX hash for every arch ([`ptx_lock`]).

use sha2::{Digest, Sha256};

use crate::manifest::Instance;
use crate::SmArch;

/// The instance name without its arch suffix (`rmsnorm_f32_sm_90a` -> `rmsnorm_f32`).
fn base_name(inst: &Instance) -> String {
    let name = inst.name();
    let sfx = format!("_{}", inst.key.arch);
    name.strip_suffix(&sfx).unwrap_or(&name).to_string()
}

/// The distinct normalised sources of one base name, each with the arches that render it.
type Variants = Vec<(String, Vec<SmArch>)>;

/// The rendered-source snapshots: (snapshot name, text) in instance order of first appearance.
pub fn render_snapshots(rendered: &[(Instance, String)]) -> Vec<(String, String)> {
    // per base name: distinct normalised sources with their arches, in order
    let mut groups: Vec<(String, Variants)> = Vec::new();
    for (inst, src) in rendered {
        let base = base_name(inst);
        let text = src.replace(inst.key.arch.as_str(), "{arch}");
        let g = match groups.iter_mut().position(|(b, _)| *b == base) {
            Some(i) => &mut groups[i].1,
            None => {
                groups.push((base, Vec::new()));
                &mut groups.last_mut().expect("just pushed").1
            }
        };
        match g.iter_mut().find(|(t, _)| *t == text) {
            Some((_, arches)) => arches.push(inst.key.arch),
            None => g.push((text, vec![inst.key.arch])),
        }
    }
    let mut out = Vec::new();
    for (base, variants) in groups {
        for (text, arches) in variants {
            let names: Vec<&str> = arches.iter().map(|a| a.as_str()).collect();
            out.push((format!("{base}_{}", names.join("+")), text));
        }
    }
    out
}

/// Whether `inst`'s PTX is snapshotted in full.
pub fn ptx_snapshotted(inst: &Instance) -> bool {
    inst.ptx_snapshot && matches!(inst.key.arch, SmArch::Sm90a | SmArch::Sm121a)
}

/// The PTX lock: a line `name sha256(normalised PTX)` per instance, sorted by name.
pub fn ptx_lock<'a>(ptx: impl IntoIterator<Item = (String, &'a str)>) -> String {
    let mut lines: Vec<String> = ptx
        .into_iter()
        .map(|(name, p)| {
            let h = Sha256::digest(crate::ptx::normalize_ptx(p).as_bytes());
            let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
            format!("{name} {hex}")
        })
        .collect();
    lines.sort();
    lines.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(arch: &str) -> Instance {
        let m = crate::Manifest::parse(&format!(
            "[[instance]]\nop=\"rmsnorm\"\nquant=\"f32\"\narches=[\"{arch}\"]\nreason=\"t\"\n"
        ))
        .unwrap();
        m.instances[0].clone()
    }

    #[test]
    fn arches_with_the_same_source_share_a_snapshot() {
        let (a, b, c) = (inst("sm_80"), inst("sm_90a"), inst("sm_121a"));
        let src = |i: &Instance, extra: &str| {
            format!("// {}\nvoid {}() {{{extra}}}\n", i.name(), i.name())
        };
        let r = vec![
            (a.clone(), src(&a, "x")),
            (b.clone(), src(&b, "")),
            (c.clone(), src(&c, "")),
        ];
        let s = render_snapshots(&r);
        let names: Vec<&str> = s.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["rmsnorm_f32_sm_80", "rmsnorm_f32_sm_90a+sm_121a"]);
        assert_eq!(
            s[1].1,
            "// rmsnorm_f32_{arch}\nvoid rmsnorm_f32_{arch}() {}\n"
        );
    }

    #[test]
    fn lock_lines_are_sorted_and_hash_normalised_ptx() {
        let l = ptx_lock([("b".to_string(), "x"), ("a".to_string(), "x")]);
        let lines: Vec<&str> = l.lines().collect();
        assert!(lines[0].starts_with("a ") && lines[1].starts_with("b "));
        assert_eq!(lines[0][2..], lines[1][2..]);
        assert_eq!(lines[0].len(), 2 + 64);
    }
}

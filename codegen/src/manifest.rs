//! `kernel-templates/manifest.toml`: the declarative list of instances to build.
//!
//! ```toml
//! [defaults]
//! arches = ["sm_80", "sm_90a", "sm_121a"]   # used when an entry has no `arches`
//!
//! [[instance]]
//! op = "rmsnorm"                # Op::as_str
//! quant = "f32"                 # a value or a list (expanded)
//! head_dim = "any"              # optional, default "any"; a value (128 or "128") or a list
//! batch = "any"                 # optional, default "any"; a value or a list
//! arches = ["sm_90a"]           # optional; overrides defaults.arches
//! template = "ops/rmsnorm.cu.tera"  # optional; default "ops/<op>.cu.tera"
//! params = { threads = 256 }    # optional; extra template variables (NOT part of the key)
//! ptx_snapshot = true           # optional; snapshot this entry's PTX (sm_90a and sm_121a)
//! reason = "why this instance exists"   # required
//! ```
//!
//! Lists expand to their cartesian product. Validation: every value names a variant, every
//! expanded key is legal ([`crate::legal`]), no key appears twice, every entry has a reason.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::key::{entry_name, BatchBucket, HeadDim, KernelKey, KeyParseError, Op, Quant, SmArch};
use crate::legal::check_legal;

/// One expanded, validated instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub key: KernelKey,
    /// Template path relative to `kernel-templates/`, `/`-separated.
    pub template: String,
    /// Extra template variables from the entry's `params` table.
    pub params: BTreeMap<String, serde_json::Value>,
    pub reason: String,
    /// Part of the representative PTX snapshot set.
    pub ptx_snapshot: bool,
    /// Index of the `[[instance]]` entry it came from (for error messages).
    pub entry: usize,
}

impl Instance {
    pub fn name(&self) -> String {
        entry_name(&self.key)
    }
}

/// The validated manifest: instances sorted by key (deterministic).
#[derive(Debug, Clone)]
pub struct Manifest {
    pub instances: Vec<Instance>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest.toml: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("manifest.toml entry #{entry} ({op}): {source}")]
    Key {
        entry: usize,
        op: String,
        source: KeyParseError,
    },
    #[error("manifest.toml entry #{entry}: {name} is not a legal combination: {why}")]
    Illegal {
        entry: usize,
        name: String,
        why: String,
    },
    #[error("manifest.toml: instance {name} is listed twice (entries #{first} and #{second})")]
    Duplicate {
        name: String,
        first: usize,
        second: usize,
    },
    #[error("manifest.toml entry #{entry} ({op}): missing or empty `reason`")]
    MissingReason { entry: usize, op: String },
    #[error("manifest.toml entry #{entry} ({op}): empty list for `{field}`")]
    EmptyList {
        entry: usize,
        op: String,
        field: &'static str,
    },
    #[error("manifest.toml entry #{entry} ({op}): params: {msg}")]
    Params {
        entry: usize,
        op: String,
        msg: String,
    },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Str(String),
    Int(i64),
}

impl Scalar {
    fn text(&self) -> String {
        match self {
            Scalar::Str(s) => s.clone(),
            Scalar::Int(i) => i.to_string(),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(Scalar),
    Many(Vec<Scalar>),
}

impl OneOrMany {
    fn texts(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.text()],
            OneOrMany::Many(v) => v.iter().map(Scalar::text).collect(),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    #[serde(default)]
    arches: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    op: String,
    quant: OneOrMany,
    head_dim: Option<OneOrMany>,
    batch: Option<OneOrMany>,
    arches: Option<Vec<String>>,
    template: Option<String>,
    #[serde(default)]
    params: toml::Table,
    #[serde(default)]
    ptx_snapshot: bool,
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default)]
    instance: Vec<RawEntry>,
}

fn parse_all<T: std::str::FromStr<Err = KeyParseError>>(
    texts: &[String],
    entry: usize,
    op: &str,
    field: &'static str,
) -> Result<Vec<T>, ManifestError> {
    if texts.is_empty() {
        return Err(ManifestError::EmptyList {
            entry,
            op: op.to_string(),
            field,
        });
    }
    texts
        .iter()
        .map(|t| {
            t.parse::<T>().map_err(|source| ManifestError::Key {
                entry,
                op: op.to_string(),
                source,
            })
        })
        .collect()
}

impl Manifest {
    /// Parse and validate the manifest text.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let raw: RawManifest = toml::from_str(text)?;
        let mut instances: Vec<Instance> = Vec::new();
        let mut by_key: BTreeMap<KernelKey, usize> = BTreeMap::new();
        for (entry, e) in raw.instance.iter().enumerate() {
            let op_name = e.op.clone();
            let reason = e.reason.as_deref().map(str::trim).unwrap_or("");
            if reason.is_empty() {
                return Err(ManifestError::MissingReason { entry, op: op_name });
            }
            let op: Op = e.op.parse().map_err(|source| ManifestError::Key {
                entry,
                op: op_name.clone(),
                source,
            })?;
            let quants: Vec<Quant> = parse_all(&e.quant.texts(), entry, &op_name, "quant")?;
            let any = vec!["any".to_string()];
            let hds: Vec<HeadDim> = parse_all(
                &e.head_dim.as_ref().map_or(any.clone(), OneOrMany::texts),
                entry,
                &op_name,
                "head_dim",
            )?;
            let bss: Vec<BatchBucket> = parse_all(
                &e.batch.as_ref().map_or(any, OneOrMany::texts),
                entry,
                &op_name,
                "batch",
            )?;
            let arch_texts = e
                .arches
                .clone()
                .unwrap_or_else(|| raw.defaults.arches.clone());
            let arches: Vec<SmArch> = parse_all(&arch_texts, entry, &op_name, "arches")?;
            let params = params_to_json(&e.params).map_err(|msg| ManifestError::Params {
                entry,
                op: op_name.clone(),
                msg,
            })?;
            let template = e
                .template
                .clone()
                .unwrap_or_else(|| format!("ops/{}.cu.tera", op.as_str()));
            for &quant in &quants {
                for &head_dim in &hds {
                    for &batch in &bss {
                        for &arch in &arches {
                            let key = KernelKey {
                                op,
                                quant,
                                head_dim,
                                batch,
                                arch,
                            };
                            check_legal(&key).map_err(|why| ManifestError::Illegal {
                                entry,
                                name: entry_name(&key),
                                why,
                            })?;
                            if let Some(&first) = by_key.get(&key) {
                                return Err(ManifestError::Duplicate {
                                    name: entry_name(&key),
                                    first,
                                    second: entry,
                                });
                            }
                            by_key.insert(key, entry);
                            instances.push(Instance {
                                key,
                                template: template.clone(),
                                params: params.clone(),
                                reason: reason.to_string(),
                                ptx_snapshot: e.ptx_snapshot,
                                entry,
                            });
                        }
                    }
                }
            }
        }
        instances.sort_by_key(|i| i.key);
        Ok(Manifest { instances })
    }

    /// Instances for one arch, in key order.
    pub fn for_arch(&self, arch: SmArch) -> impl Iterator<Item = &Instance> {
        self.instances.iter().filter(move |i| i.key.arch == arch)
    }
}

fn params_to_json(t: &toml::Table) -> Result<BTreeMap<String, serde_json::Value>, String> {
    let mut out = BTreeMap::new();
    for (k, v) in t {
        let j = serde_json::to_value(v).map_err(|e| format!("{k}: {e}"))?;
        out.insert(k.clone(), j);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
        [defaults]
        arches = ["sm_90a", "sm_121a"]
        [[instance]]
        op = "rmsnorm"
        quant = "f32"
        params = { threads = 256 }
        reason = "norms"
        [[instance]]
        op = "attn_decode"
        quant = "fp8_e4m3"
        head_dim = [128, "256"]
        batch = 1
        arches = ["sm_90a"]
        reason = "decode"
    "#;

    #[test]
    fn expands_sorted() {
        let m = Manifest::parse(OK).unwrap();
        let names: Vec<String> = m.instances.iter().map(Instance::name).collect();
        assert_eq!(
            names,
            [
                "rmsnorm_f32_sm_90a",
                "rmsnorm_f32_sm_121a",
                "attn_decode_fp8_e4m3_hd128_bs1_sm_90a",
                "attn_decode_fp8_e4m3_hd256_bs1_sm_90a"
            ]
        );
        assert_eq!(m.instances[0].params["threads"], serde_json::json!(256));
        assert_eq!(m.instances[0].template, "ops/rmsnorm.cu.tera");
    }

    #[test]
    fn rejects_duplicates_illegal_unknown_and_reasonless() {
        let dup =
            format!("{OK}\n[[instance]]\nop = \"rmsnorm\"\nquant = \"f32\"\nreason = \"x\"\n");
        let e = Manifest::parse(&dup).unwrap_err();
        assert!(matches!(e, ManifestError::Duplicate { .. }), "{e}");
        assert!(e.to_string().contains("rmsnorm_f32_sm_90a"), "{e}");

        let ill = "[[instance]]\nop = \"rmsnorm\"\nquant = \"q4_0\"\narches=[\"sm_80\"]\nreason = \"x\"\n";
        assert!(matches!(
            Manifest::parse(ill).unwrap_err(),
            ManifestError::Illegal { .. }
        ));

        let unk =
            "[[instance]]\nop = \"rmsnrom\"\nquant = \"f32\"\narches=[\"sm_80\"]\nreason = \"x\"\n";
        let e = Manifest::parse(unk).unwrap_err();
        assert!(e.to_string().contains("rmsnrom"), "{e}");

        let nr = "[[instance]]\nop = \"rmsnorm\"\nquant = \"f32\"\narches=[\"sm_80\"]\n";
        assert!(matches!(
            Manifest::parse(nr).unwrap_err(),
            ManifestError::MissingReason { .. }
        ));

        let typo =
            "[[instance]]\nop = \"rmsnorm\"\nquant = \"f32\"\narchs=[\"sm_80\"]\nreason=\"x\"\n";
        assert!(matches!(
            Manifest::parse(typo).unwrap_err(),
            ManifestError::Toml(_)
        ));

        let empty =
            "[[instance]]\nop = \"rmsnorm\"\nquant = []\narches=[\"sm_80\"]\nreason=\"x\"\n";
        assert!(matches!(
            Manifest::parse(empty).unwrap_err(),
            ManifestError::EmptyList { .. }
        ));
    }
}

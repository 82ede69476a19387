//! Tera rendering of `kernel-templates/` into CUDA C, one source per instance.
//!
//! Template variables (every template gets exactly these):
//!
//! | variable | type | example |
//! |---|---|---|
//! | `entry` | string | `rmsnorm_f32_sm_90a` — the `extern "C"` name of the main kernel |
//! | `op`, `quant`, `arch` | string | `rmsnorm`, `f32`, `sm_90a` |
//! | `head_dim`, `batch` | int (0 = any) | `128`, `1` |
//! | `sm` | int | `90` (80, 89, 90, 120, 121) |
//! | `has_fp8_mma`, `has_wgmma`, `has_fp4_mma` | bool | arch family switches |
//! | `params` | map | the entry's `params` table, e.g. `params.threads` |
//! | each param | any | also top-level: `threads` == `params.threads` (may not shadow the above) |
//! | `template` | string | `ops/rmsnorm.cu.tera` |
//!
//! Lib macros live in `kernel-templates/lib/*.tera` and are imported at the top of an op
//! template: `{% import "lib/reduce.cuh.tera" as reduce %}`, then `{{ reduce::warp() }}` emits
//! the device functions once. The renderer prepends a header naming the template and the
//! parameters and saying the file is generated, strips trailing spaces and squeezes runs of
//! blank lines, so output is stable and byte-identical run to run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::manifest::Instance;

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("reading templates: {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("loading templates: {0}")]
    Load(String),
    #[error("instance {name}: template {template} does not exist under kernel-templates/")]
    MissingTemplate { name: String, template: String },
    #[error("instance {name}: param `{param}` shadows a key variable of the same name")]
    ReservedParam { name: String, param: String },
    #[error("instance {name}: rendering {template} failed: {detail}")]
    Render {
        name: String,
        template: String,
        detail: String,
    },
}

/// Variables every template gets from the key; manifest params may not reuse these names.
pub const RESERVED: &[&str] = &[
    "entry",
    "op",
    "quant",
    "arch",
    "head_dim",
    "batch",
    "sm",
    "has_fp8_mma",
    "has_wgmma",
    "has_fp4_mma",
    "params",
    "template",
];

/// Every `*.tera` file under `dir`, as (`/`-separated relative path, contents), sorted.
pub fn read_templates(dir: &Path) -> Result<Vec<(String, String)>, RenderError> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) -> Result<(), RenderError> {
        let rd = std::fs::read_dir(dir).map_err(|source| RenderError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut entries: Vec<PathBuf> = Vec::new();
        for e in rd {
            let e = e.map_err(|source| RenderError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
            entries.push(e.path());
        }
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(root, &p, out)?;
            } else if p.extension().is_some_and(|x| x == "tera") {
                let text = std::fs::read_to_string(&p).map_err(|source| RenderError::Io {
                    path: p.clone(),
                    source,
                })?;
                let rel = p.strip_prefix(root).unwrap_or(&p);
                let name: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push((name.join("/"), text));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A loaded template set.
pub struct Renderer {
    tera: tera::Tera,
}

impl Renderer {
    /// Load every template under `dir` (normally `kernel-templates/`).
    pub fn from_dir(dir: &Path) -> Result<Renderer, RenderError> {
        Renderer::from_templates(read_templates(dir)?)
    }

    pub fn from_templates(templates: Vec<(String, String)>) -> Result<Renderer, RenderError> {
        let mut tera = tera::Tera::default();
        tera.autoescape_on(vec![]);
        tera.add_raw_templates(templates)
            .map_err(|e| RenderError::Load(error_chain(&e)))?;
        Ok(Renderer { tera })
    }

    /// Render one instance to CUDA C (header included).
    pub fn render(&self, inst: &Instance) -> Result<String, RenderError> {
        let name = inst.name();
        if !self.tera.get_template_names().any(|t| t == inst.template) {
            return Err(RenderError::MissingTemplate {
                name,
                template: inst.template.clone(),
            });
        }
        let k = &inst.key;
        let mut ctx = tera::Context::new();
        ctx.insert("entry", &name);
        ctx.insert("op", k.op.as_str());
        ctx.insert("quant", k.quant.as_str());
        ctx.insert("arch", k.arch.as_str());
        ctx.insert("head_dim", &k.head_dim.value().unwrap_or(0));
        ctx.insert("batch", &k.batch.value().unwrap_or(0));
        ctx.insert("sm", &k.arch.sm());
        ctx.insert("has_fp8_mma", &k.arch.has_fp8_mma());
        ctx.insert("has_wgmma", &k.arch.has_wgmma());
        ctx.insert("has_fp4_mma", &k.arch.has_fp4_mma());
        ctx.insert("params", &inst.params);
        ctx.insert("template", &inst.template);
        // Params are also top-level variables (`{{ threads }}` == `{{ params.threads }}`), so
        // templates written against a flat context work unchanged; they may not shadow the key.
        for (k, v) in &inst.params {
            if RESERVED.contains(&k.as_str()) {
                return Err(RenderError::ReservedParam {
                    name,
                    param: k.clone(),
                });
            }
            ctx.insert(k.as_str(), v);
        }
        let body = self
            .tera
            .render(&inst.template, &ctx)
            .map_err(|e| RenderError::Render {
                name: name.clone(),
                template: inst.template.clone(),
                detail: error_chain(&e),
            })?;
        let body = if k.arch.sm() >= 90 {
            pdl_wait(&body)
        } else {
            body
        };
        Ok(format!("{}{}", header(inst), tidy(&body)))
    }
}

/// The statement that makes a kernel wait for the grid it depends on programmatically.
pub const PDL_WAIT: &str = "asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");";
/// Lets the next kernel of a programmatic chain be scheduled (it then waits in its own
/// `PDL_WAIT` until this grid completes): issued right after the wait, so launches run at most
/// one kernel ahead and the next kernel's launch latency hides under this one's work.
pub const PDL_TRIGGER: &str = "asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\");";

/// Programmatic dependent launch (sm_90+): the runtime turns kernel-to-kernel edges of a captured
/// decode graph into programmatic ones (`src/backend/cuda/graph.rs`), so a kernel may start while
/// the one before it drains. Every kernel must then wait for its predecessor before touching
/// memory: this inserts `griddepcontrol.wait` (a no-op when launched normally) as the first
/// statement of every `extern "C" __global__` function, followed by
/// `griddepcontrol.launch_dependents` (see [`PDL_TRIGGER`]). A template that places the wait itself
/// (to prefetch weights first, as `ops/gemv`) is left alone: it must then wait in every kernel
/// it defines.
pub fn pdl_wait(src: &str) -> String {
    if src.contains(PDL_WAIT) {
        return src.to_string();
    }
    let mut out = String::with_capacity(src.len() + 256);
    let mut rest = src;
    while let Some(i) = rest.find("extern \"C\" __global__") {
        let Some(j) = rest[i..].find('{') else {
            break;
        };
        let brace = i + j + 1;
        out.push_str(&rest[..brace]);
        out.push_str("\n    ");
        out.push_str(PDL_WAIT);
        out.push_str("\n    ");
        out.push_str(PDL_TRIGGER);
        rest = &rest[brace..];
    }
    out.push_str(rest);
    out
}

/// The generated-file header: template, instance, key fields, params.
pub fn header(inst: &Instance) -> String {
    let k = &inst.key;
    let params: BTreeMap<&String, &serde_json::Value> = inst.params.iter().collect();
    let params = serde_json::to_string(&params).unwrap_or_default();
    format!(
        "// GENERATED by fucina codegen from kernel-templates/{} -- do not edit.\n\
         // Regenerate with `cargo xtask gen-kernels`.\n\
         // instance: {} (op={} quant={} head_dim={} batch={} arch={})\n\
         // params: {}\n\n",
        inst.template,
        inst.name(),
        k.op,
        k.quant,
        k.head_dim,
        k.batch,
        k.arch,
        params
    )
}

/// Strip trailing whitespace, squeeze blank-line runs to one, end with exactly one newline.
fn tidy(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut blank = true; // drop leading blank lines
    for line in s.lines() {
        let l = line.trim_end();
        if l.is_empty() {
            if blank {
                continue;
            }
            blank = true;
        } else {
            blank = false;
        }
        out.push_str(l);
        out.push('\n');
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Manifest;

    #[test]
    fn pdl_wait_opens_every_kernel_once() {
        let src = "__device__ int f() { return 1; }\nextern \"C\" __global__ void __launch_bounds__(64) a(int* x) {\n  x[0] = 1;\n}\nextern \"C\" __global__ void b() { }\n";
        let out = pdl_wait(src);
        assert_eq!(out.matches(PDL_WAIT).count(), 2);
        assert!(out.starts_with("__device__ int f() { return 1; }"));
        assert!(out.contains(&format!(
            "a(int* x) {{\n    {PDL_WAIT}\n    {PDL_TRIGGER}\n  x[0] = 1;"
        )));
        // a template that waits itself is untouched
        let manual = format!("extern \"C\" __global__ void g() {{ {PDL_WAIT} }}");
        assert_eq!(pdl_wait(&manual), manual);
    }

    #[test]
    fn renders_with_header_and_variables() {
        let m = Manifest::parse(
            "[[instance]]\nop=\"rmsnorm\"\nquant=\"f32\"\narches=[\"sm_90a\"]\nparams={threads=128}\nreason=\"t\"\n",
        )
        .unwrap();
        let r = Renderer::from_templates(vec![
            ("lib/x.cuh.tera".into(), "{% macro f(n) %}int f{{ n }}();{% endmacro f %}".into()),
            (
                "ops/rmsnorm.cu.tera".into(),
                "{% import \"lib/x.cuh.tera\" as x %}\n\n\n{{ x::f(n=sm) }}   \nextern \"C\" __global__ void {{ entry }}() {} // {{ params.threads }} {{ has_wgmma }} {{ threads }}\n\n\n".into(),
            ),
        ])
        .unwrap();
        let s = r.render(&m.instances[0]).unwrap();
        assert!(s.starts_with(
            "// GENERATED by fucina codegen from kernel-templates/ops/rmsnorm.cu.tera"
        ));
        assert!(s.contains("params: {\"threads\":128}"));
        assert!(s.contains(
            "int f90();\nextern \"C\" __global__ void rmsnorm_f32_sm_90a() {\n    asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n    asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\");} // 128 true 128\n"
        ));
        assert!(s.ends_with("128\n"));
        let mut bad = m.instances[0].clone();
        bad.params.insert("sm".into(), serde_json::json!(1));
        assert!(matches!(
            r.render(&bad),
            Err(RenderError::ReservedParam { .. })
        ));
    }

    #[test]
    fn missing_template_and_bad_variable_are_errors() {
        let m = Manifest::parse(
            "[[instance]]\nop=\"softmax\"\nquant=\"f32\"\narches=[\"sm_80\"]\nreason=\"t\"\n",
        )
        .unwrap();
        let r = Renderer::from_templates(vec![]).unwrap();
        assert!(matches!(
            r.render(&m.instances[0]),
            Err(RenderError::MissingTemplate { .. })
        ));
        let r = Renderer::from_templates(vec![("ops/softmax.cu.tera".into(), "{{ nope }}".into())])
            .unwrap();
        let e = r.render(&m.instances[0]).unwrap_err();
        assert!(e.to_string().contains("softmax_f32_sm_80"), "{e}");
        assert!(e.to_string().contains("nope"), "{e}");
    }
}

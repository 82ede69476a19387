//! L0 (no CUDA): every kernel of every sm_90+ instance waits for the kernel before it.
//!
//! Captured decode steps turn kernel-to-kernel edges into programmatic ones (PDL): a kernel may
//! start while its predecessor still runs, and must execute `griddepcontrol.wait` before it
//! reads what that predecessor wrote. The renderer opens every kernel with the wait unless the
//! template places it itself; a template that does must do so in every kernel body, or that
//! kernel reads stale inputs on replay (a template edit once dropped the wait of the decode
//! attention's warp-per-head entry: small head dims decoded wrong with graphs, right without).

mod common;

/// The `extern "C" __global__` functions of `src`: (name, body up to the next kernel).
fn kernels(src: &str) -> Vec<(String, &str)> {
    const MARK: &str = "extern \"C\" __global__";
    let starts: Vec<usize> = src.match_indices(MARK).map(|(i, _)| i).collect();
    starts
        .iter()
        .enumerate()
        .map(|(n, &i)| {
            let end = starts.get(n + 1).copied().unwrap_or(src.len());
            let text = &src[i..end];
            (kernel_name(text), text)
        })
        .collect()
}

/// The name in a kernel's declaration: the identifier before the first `(` that does not open an
/// attribute (`__launch_bounds__(..)`, `__cluster_dims__(..)`).
fn kernel_name(decl: &str) -> String {
    let mut rest = decl;
    while let Some(i) = rest.find('(') {
        let ident = rest[..i]
            .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        if ident.starts_with("__") && ident.ends_with("__") {
            rest = &rest[i + rest[i..].find(')').map_or(1, |j| j + 1)..];
            continue;
        }
        return ident.to_string();
    }
    "?".into()
}

/// The `__device__` functions of `src` that wait, directly or through another such function.
fn waiting_helpers(src: &str) -> Vec<String> {
    let mut starts: Vec<usize> = src.match_indices("__device__").map(|(i, _)| i).collect();
    starts.extend(src.match_indices("extern \"C\" __global__").map(|(i, _)| i));
    starts.sort_unstable();
    let chunks: Vec<(String, &str)> = starts
        .iter()
        .enumerate()
        .filter(|(_, &i)| src[i..].starts_with("__device__"))
        .map(|(n, &i)| {
            let end = starts.get(n + 1).copied().unwrap_or(src.len());
            (kernel_name(&src[i..end]), &src[i..end])
        })
        .collect();
    let mut found: Vec<String> = Vec::new();
    loop {
        let before = found.len();
        for (name, body) in &chunks {
            if !found.contains(name) && waits(body, &found) {
                found.push(name.clone());
            }
        }
        if found.len() == before {
            return found;
        }
    }
}

/// Whether a body waits: the statement itself, or a call of a helper that issues it.
fn waits(body: &str, helpers: &[String]) -> bool {
    body.contains("griddepcontrol.wait")
        || helpers
            .iter()
            .any(|h| body.contains(&format!("{h}(")) || body.contains(&format!("{h}<")))
}

#[test]
fn every_sm90_kernel_waits_for_its_predecessor() {
    let rendered = codegen::render_all(&common::templates_dir()).expect("render kernel-templates");
    let mut checked = 0;
    let mut missing = Vec::new();
    for (inst, src) in &rendered {
        if inst.key.arch.sm() < 90 {
            continue;
        }
        let helpers = waiting_helpers(src);
        for (name, body) in kernels(src) {
            checked += 1;
            if !waits(body, &helpers) {
                missing.push(name);
            }
        }
    }
    assert!(checked > 100, "only {checked} sm_90 kernels rendered");
    assert!(
        missing.is_empty(),
        "kernels that never wait for their predecessor (PDL): {missing:?}"
    );
}

#[test]
fn the_scan_sees_a_missing_wait() {
    let src = "extern \"C\" __global__ void a() { asm volatile(\"griddepcontrol.wait;\"); }\n\
               extern \"C\" __global__ void __launch_bounds__(64) b(int* x) { x[0] = 1; }\n";
    let k = kernels(src);
    assert_eq!(k.len(), 2);
    assert_eq!(k[1].0, "b");
    assert!(waits(k[0].1, &[]) && !waits(k[1].1, &[]));
    // a kernel that waits through a helper (as the GEMVs' rows_dot)
    let via = "__device__ void w() { asm volatile(\"griddepcontrol.wait;\"); }\n\
               template <int M> __device__ __forceinline__ void rows_dot(int x) { w(); }\n\
               extern \"C\" __global__ void c() { rows_dot<2>(1); }\n";
    let h = waiting_helpers(via);
    assert_eq!(h, vec!["w".to_string(), "rows_dot".to_string()]);
    assert!(waits(kernels(via)[0].1, &h));
}

//! Profiling aids for recorded decode steps, for measuring what a kernel costs *inside* the
//! graph (where programmatic launches overlap kernels, so isolated timings such as ncu's do not
//! add up to the step time). Neither is for use outside measurements: an ablated step computes
//! wrong values.
//!
//! - `FUCINA_GRAPH_SKIP=pat1,pat2`: kernel nodes whose function name contains one of the
//!   patterns (or is one of them, for a pattern written `=name`) are removed from a captured step before it is instantiated, each predecessor
//!   joined to each successor. The decode rate with and without a kernel is its in-graph cost.
//! - `FUCINA_REPLAY_REPEAT=N`: every replay launches the step N times (the extra launches
//!   recompute the same token at the same position). The per-token time at N = 1 and N = 2
//!   separates the step's device time from the host's time between steps.
//! - `FUCINA_GRAPH_DUMP=1`: the captured step's make-up is logged once it is final (nodes by
//!   type, edges by dependency type, and every node that waits on a full, non-programmatic
//!   edge), to see what breaks the programmatic chain.
//!
//! Compiled only with `--features profiling`; the settings are [`crate::tuning::Profiling`].

use std::ffi::CStr;

use cudarc::driver::sys;

use super::error::CudaError;

fn check(r: sys::CUresult, what: &'static str) -> Result<(), CudaError> {
    super::error::cu_check(r, "graph ablation", what)
}

/// Whether a kernel's function name matches a pattern: `=name` the whole name, else a part of it.
fn name_matches(name: &str, pattern: &str) -> bool {
    match pattern.strip_prefix('=') {
        Some(exact) => name == exact,
        None => name.contains(pattern),
    }
}

/// The function name of a kernel node, None for other nodes.
///
/// # Safety
/// `node` must be a valid node of a graph not being executed concurrently.
unsafe fn kernel_name(node: sys::CUgraphNode) -> Option<String> {
    let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    if sys::cuGraphNodeGetType(node, &mut t) != sys::CUresult::CUDA_SUCCESS
        || t != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL
    {
        return None;
    }
    let mut p: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
    if sys::cuGraphKernelNodeGetParams_v2(node, &mut p) != sys::CUresult::CUDA_SUCCESS
        || p.func.is_null()
    {
        return None;
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    if sys::cuFuncGetName(&mut name, p.func) != sys::CUresult::CUDA_SUCCESS || name.is_null() {
        return None;
    }
    Some(CStr::from_ptr(name).to_string_lossy().into_owned())
}

/// Nodes joined to `node` by an edge: its predecessors (`deps`) or its successors.
///
/// # Safety
/// As [`kernel_name`].
unsafe fn neighbours(
    node: sys::CUgraphNode,
    deps: bool,
) -> Result<Vec<sys::CUgraphNode>, CudaError> {
    let get = |out: *mut sys::CUgraphNode, n: &mut usize| {
        if deps {
            sys::cuGraphNodeGetDependencies_v2(node, out, std::ptr::null_mut(), n)
        } else {
            sys::cuGraphNodeGetDependentNodes_v2(node, out, std::ptr::null_mut(), n)
        }
    };
    let mut n = 0usize;
    check(get(std::ptr::null_mut(), &mut n), "counting a node's edges")?;
    let mut v = vec![std::ptr::null_mut(); n];
    if n > 0 {
        check(get(v.as_mut_ptr(), &mut n), "reading a node's edges")?;
        v.truncate(n);
    }
    Ok(v)
}

/// Every node of `g`.
///
/// # Safety
/// `g` must be a valid graph, not executed concurrently.
unsafe fn graph_nodes(g: sys::CUgraph) -> Result<Vec<sys::CUgraphNode>, CudaError> {
    let mut n = 0usize;
    check(
        sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut n),
        "counting graph nodes",
    )?;
    let mut nodes = vec![std::ptr::null_mut(); n];
    check(
        sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n),
        "reading graph nodes",
    )?;
    nodes.truncate(n);
    Ok(nodes)
}

/// Remove from `g` every kernel node whose name contains one of `patterns`, joining each
/// removed node's predecessors to its successors. Returns how many nodes went.
///
/// # Safety
/// `g` must be a valid graph, not instantiated or executed concurrently.
pub unsafe fn remove_kernels(g: sys::CUgraph, patterns: &[String]) -> Result<usize, CudaError> {
    if patterns.is_empty() {
        return Ok(0);
    }
    let nodes = graph_nodes(g)?;
    let mut removed = 0;
    for node in nodes {
        let Some(name) = kernel_name(node) else {
            continue;
        };
        if !patterns.iter().any(|p| name_matches(&name, p)) {
            continue;
        }
        let pre = neighbours(node, true)?;
        let post = neighbours(node, false)?;
        check(sys::cuGraphDestroyNode(node), "removing a node")?;
        for a in &pre {
            for b in &post {
                check(
                    sys::cuGraphAddDependencies_v2(g, a, b, std::ptr::null(), 1),
                    "joining a removed node's neighbours",
                )?;
            }
        }
        removed += 1;
    }
    tracing::warn!(
        removed,
        ?patterns,
        "FUCINA_GRAPH_SKIP: kernels removed from the recorded step (profiling only: wrong values)"
    );
    Ok(removed)
}

/// Short name of a node: its kernel's function name, else its node type.
///
/// # Safety
/// As [`kernel_name`].
unsafe fn node_label(node: sys::CUgraphNode) -> String {
    if let Some(k) = kernel_name(node) {
        return k;
    }
    let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    sys::cuGraphNodeGetType(node, &mut t);
    format!("{t:?}")
}

/// The make-up of `g`: node counts by type, edge counts by dependency type, and the nodes
/// entered through a full (non-programmatic) edge, in capture order, with their predecessor.
///
/// # Safety
/// `g` must be a valid graph, not executed concurrently.
pub unsafe fn describe(g: sys::CUgraph) -> Result<String, CudaError> {
    use std::collections::BTreeMap;
    let nodes = graph_nodes(g)?;
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut full = Vec::new();
    let (mut prog, mut other) = (0usize, 0usize);
    for &node in &nodes {
        let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        sys::cuGraphNodeGetType(node, &mut t);
        *kinds.entry(format!("{t:?}")).or_default() += 1;
        let mut m = 0usize;
        check(
            sys::cuGraphNodeGetDependencies_v2(
                node,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut m,
            ),
            "counting a node's edges",
        )?;
        let mut deps = vec![std::ptr::null_mut(); m];
        let mut data: Vec<sys::CUgraphEdgeData> = vec![std::mem::zeroed(); m];
        if m > 0 {
            check(
                sys::cuGraphNodeGetDependencies_v2(
                    node,
                    deps.as_mut_ptr(),
                    data.as_mut_ptr(),
                    &mut m,
                ),
                "reading a node's edges",
            )?;
        }
        for (d, e) in deps.iter().zip(&data).take(m) {
            if e.type_ != 0 {
                prog += 1;
            } else {
                other += 1;
                full.push(format!("{} <- {}", node_label(node), node_label(*d)));
            }
        }
    }
    let mut s = format!(
        "{} nodes {kinds:?}; edges: {prog} programmatic, {other} full",
        nodes.len()
    );
    for f in full {
        s.push_str("\n  full edge: ");
        s.push_str(&f);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `=name` matches that whole name only (a GEMV's main entry, not its `__glu` or `__ks`
    /// entries, whose names it begins); other patterns match any part.
    #[test]
    fn exact_patterns_match_whole_names() {
        let main = "gemv_q4_0r_bs1_sm_90a";
        assert!(name_matches(main, "=gemv_q4_0r_bs1_sm_90a"));
        assert!(!name_matches(
            "gemv_q4_0r_bs1_sm_90a__glu",
            "=gemv_q4_0r_bs1_sm_90a"
        ));
        assert!(name_matches(
            "gemv_q4_0r_bs1_sm_90a__glu",
            "gemv_q4_0r_bs1_sm_90a"
        ));
        assert!(name_matches(main, "q4_0r"));
        assert!(!name_matches(main, "=q4_0r"));
    }
}

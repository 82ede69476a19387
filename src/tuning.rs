//! Tuning: the settings that choose between equivalent code paths (launch shapes, which fused
//! kernel runs, kill switches of the default paths), read once from `FUCINA_*` environment
//! variables at start-up and nowhere else. Every setting computes the same model either way (the
//! selftest runs both sides where a path has two); they exist to measure and to work around a
//! driver or device that misbehaves. User-facing settings are not here: they are clap flags of
//! the commands (with `env` fallbacks).
//!
//! `fucina bench` prints the settings that differ from the defaults, and so does `--verbose`.

use std::fmt;
use std::sync::OnceLock;

/// Where the row-norm of a residual block is deferred into its consumer (`FUCINA_DEFER_NORM`):
/// `0` never, `1` always, `linear` where the consumer is not one `__glu` launch, `glu` only there.
/// Unset: the measured default per weight format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeferNorm {
    Never,
    Always,
    Linear,
    Glu,
}

/// When the GEMV takes its `__s2` entry (`FUCINA_GEMV_S2`: `always`/`1`, `never`/`0`, default
/// `long`: rows of at least 3 staged chunks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvS2 {
    Never,
    Long,
    Always,
}

/// The tuning settings. Defaults (`Tuning::default()`) are the measured choices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Decode steps recorded once and replayed as CUDA graphs (the `--no-graphs` flag clears it).
    pub graphs: bool,

    // ---- kill switches of default paths (`FUCINA_X=0` turns one off)
    /// The next decode step queued before the host reads the sampled id (`FUCINA_PIPELINE`).
    pub pipeline: bool,
    /// The device sampler hands its id to the next step's embedding (`FUCINA_SAMPLE_HANDOVER`).
    pub sample_handover: bool,
    /// Programmatic dependent launch on sm_90+ (`FUCINA_NO_PDL=1` turns it off).
    pub pdl: bool,
    /// Weight rows repacked at upload (`FUCINA_REPACK`), and Q6_K among them (`FUCINA_REPACK_Q6K`).
    pub repack: bool,
    pub repack_q6k: bool,
    /// The wgmma tiles of `gemm_pipe` on sm_90a (`FUCINA_GEMM_WGMMA`).
    pub gemm_wgmma: bool,
    /// One `__glu` GEMV for gate|up and the GLU (`FUCINA_GEMV_GLU`).
    pub gemv_glu: bool,
    /// The residual GEMVs' warps capped by their tasks (`FUCINA_RES_TASK_WARPS`).
    pub res_task_warps: bool,
    /// The deferred-norm Q6_K|Q4_K value projection in one launch (`FUCINA_RSQV`).
    pub rsqv: bool,
    /// The GLU GEMV writing the residual (`FUCINA_GLURS`).
    pub glurs: bool,
    /// A decode row's q|k|v projection and attention prep in one launch (`FUCINA_QKV_PREP`).
    pub qkv_prep: bool,
    /// A one-row `norm_add_rmsnorm` split over several blocks (`FUCINA_NORM_ADD_SPLIT`).
    pub norm_add_split: bool,
    /// Decode attention writes its output's int8 side-car (`FUCINA_ATTN_Q8`).
    pub attn_q8: bool,
    /// The whole-group (GQA) decode attention entry (`FUCINA_ATTN_GQA`), its tensor-core form
    /// (`FUCINA_ATTN_MMA`) and its fused split merge (`FUCINA_GQA_FUSED_MERGE`).
    pub attn_gqa: bool,
    pub attn_mma: bool,
    pub gqa_fused_merge: bool,
    /// MoE prefill on tensor cores (`FUCINA_MOE_GEMM`), grouped by expert (`FUCINA_MOE_GROUPED`).
    pub moe_gemm: bool,
    pub moe_grouped: bool,
    /// MoE decode: the fused expert launches (`FUCINA_MOE_FUSED`), the router fused with the
    /// norm (`FUCINA_MOE_NORM_FUSED`), the down projection started early (`FUCINA_MOE_DOWN_EARLY`).
    pub moe_fused: bool,
    pub moe_norm_fused: bool,
    pub moe_down_early: bool,

    // ---- launch shapes and sizes (unset: the measured default)
    pub defer_norm: Option<DeferNorm>,
    pub gemv_s2: GemvS2,
    /// Ways a batch-1 repacked GEMV row is split over warps (`FUCINA_GEMV_KS`: 1, 2, 4, 8).
    pub gemv_ks: Option<u32>,
    /// Rows above which the GEMV k split is not used (`FUCINA_GEMV_KS_MAX_ROWS`).
    pub gemv_ks_max_rows: Option<usize>,
    /// Warps per block of the `__glu` entry (`FUCINA_GLU_WARPS`, 1..=16).
    pub glu_warps: Option<u32>,
    /// Warps per block of the `__res` entries (`FUCINA_RES_WARPS`).
    pub res_warps: Option<u32>,
    /// Blocks of a one-row `add_rms_norm` (`FUCINA_ADD_NORM_CHUNKS`; 0: the one-block kernel).
    pub add_norm_chunks: Option<usize>,
    /// Most blocks of a split `norm_add_rmsnorm` (`FUCINA_NORM_ADD_CHUNKS`).
    pub norm_add_chunks: Option<usize>,
    /// Fewest keys per split of decode attention (`FUCINA_ATTN_MIN_CHUNK`, a multiple of 32).
    pub attn_min_chunk: Option<usize>,
    /// The `gemm_pipe` tile, by name (`FUCINA_GEMM_TILE`).
    pub gemm_tile: Option<String>,
    /// Bytes of bf16 weight scratch one prefill `linear` holds (`FUCINA_GEMM_SCRATCH_MB`). 256 MiB,
    /// not 128: at 128 Qwen3-8B's gate|up ran as two 12288-row GEMMs on the 128 x 128 tile and
    /// its pp512 read 17.2k tok/s against 19.0k (H200).
    pub gemm_scratch_bytes: usize,
    /// Prompt tokens per prefill pass (`FUCINA_PREFILL_CHUNK`).
    pub prefill_chunk: usize,
    /// A recurrent model's session snapshots its recurrent state every this many positions
    /// (and at the end of each prompt), so a rewind recomputes at most that many tokens
    /// (`FUCINA_SNAPSHOT_EVERY`).
    pub snapshot_every: usize,
    /// Snapshots a session keeps, the newest (`FUCINA_SNAPSHOT_KEEP`; 0: none, rewinds of
    /// recurrent models re-prefill).
    pub snapshot_keep: usize,

    /// Measurement aids of profiling builds (`--features profiling`).
    #[cfg(feature = "profiling")]
    pub profiling: Profiling,
}

/// Measurement aids: an ablated or repeated step computes wrong values, so they exist only in
/// builds with the `profiling` feature (see `backend::cuda::graph_ablate`).
#[cfg(feature = "profiling")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profiling {
    /// Kernel nodes removed from a captured step (`FUCINA_GRAPH_SKIP=pat1,=exact,...`).
    pub graph_skip: Vec<String>,
    /// Launches per replay (`FUCINA_REPLAY_REPEAT`).
    pub replay_repeat: usize,
    /// Log the captured step's make-up (`FUCINA_GRAPH_DUMP=1`).
    pub graph_dump: bool,
    /// `#define` lines put in front of kernels naming them (`FUCINA_DEV_DEFINES=FUCINA_A=1,...`).
    pub dev_defines: String,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            graphs: true,
            pipeline: true,
            sample_handover: true,
            pdl: true,
            repack: true,
            repack_q6k: true,
            gemm_wgmma: true,
            gemv_glu: true,
            res_task_warps: true,
            rsqv: true,
            glurs: true,
            qkv_prep: true,
            norm_add_split: true,
            attn_q8: true,
            attn_gqa: true,
            attn_mma: true,
            gqa_fused_merge: true,
            moe_gemm: true,
            moe_grouped: true,
            moe_fused: true,
            moe_norm_fused: true,
            moe_down_early: true,
            defer_norm: None,
            gemv_s2: GemvS2::Long,
            gemv_ks: None,
            gemv_ks_max_rows: None,
            glu_warps: None,
            res_warps: None,
            add_norm_chunks: None,
            norm_add_chunks: None,
            attn_min_chunk: None,
            gemm_tile: None,
            gemm_scratch_bytes: 256 << 20,
            prefill_chunk: 8192,
            snapshot_every: 256,
            snapshot_keep: 4,
            #[cfg(feature = "profiling")]
            profiling: Profiling {
                replay_repeat: 1,
                ..Profiling::default()
            },
        }
    }
}

impl Tuning {
    /// The settings from the process environment.
    pub fn from_env() -> Tuning {
        Tuning::from_lookup(|k| std::env::var(k).ok())
    }

    /// The settings from `get` (a variable's value, None when unset); values that do not parse
    /// keep the default.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Tuning {
        let d = Tuning::default();
        let var = |name: &str| get(&format!("FUCINA_{name}")).map(|v| v.trim().to_string());
        // a kill switch: on unless set to 0
        let on = |name: &str, def: bool| var(name).map_or(def, |v| v != "0");
        let num = |name: &str| var(name).and_then(|v| v.parse::<usize>().ok());
        Tuning {
            graphs: d.graphs,
            pipeline: on("PIPELINE", d.pipeline),
            sample_handover: on("SAMPLE_HANDOVER", d.sample_handover),
            pdl: var("NO_PDL").as_deref() != Some("1"),
            repack: on("REPACK", d.repack),
            repack_q6k: on("REPACK_Q6K", d.repack_q6k),
            gemm_wgmma: on("GEMM_WGMMA", d.gemm_wgmma),
            gemv_glu: on("GEMV_GLU", d.gemv_glu),
            res_task_warps: on("RES_TASK_WARPS", d.res_task_warps),
            rsqv: on("RSQV", d.rsqv),
            glurs: on("GLURS", d.glurs),
            qkv_prep: on("QKV_PREP", d.qkv_prep),
            norm_add_split: on("NORM_ADD_SPLIT", d.norm_add_split),
            attn_q8: on("ATTN_Q8", d.attn_q8),
            attn_gqa: on("ATTN_GQA", d.attn_gqa),
            attn_mma: on("ATTN_MMA", d.attn_mma),
            gqa_fused_merge: on("GQA_FUSED_MERGE", d.gqa_fused_merge),
            moe_gemm: on("MOE_GEMM", d.moe_gemm),
            moe_grouped: on("MOE_GROUPED", d.moe_grouped),
            moe_fused: on("MOE_FUSED", d.moe_fused),
            moe_norm_fused: on("MOE_NORM_FUSED", d.moe_norm_fused),
            moe_down_early: on("MOE_DOWN_EARLY", d.moe_down_early),
            defer_norm: match var("DEFER_NORM").as_deref() {
                Some("0") => Some(DeferNorm::Never),
                Some("1") => Some(DeferNorm::Always),
                Some("linear") => Some(DeferNorm::Linear),
                Some("glu") => Some(DeferNorm::Glu),
                _ => None,
            },
            gemv_s2: match var("GEMV_S2").as_deref() {
                Some("always" | "1") => GemvS2::Always,
                Some("never" | "0") => GemvS2::Never,
                _ => GemvS2::Long,
            },
            gemv_ks: match var("GEMV_KS").as_deref() {
                Some("0" | "1") => Some(1),
                Some("2") => Some(2),
                Some("4") => Some(4),
                Some("8") => Some(8),
                _ => None,
            },
            gemv_ks_max_rows: num("GEMV_KS_MAX_ROWS"),
            glu_warps: num("GLU_WARPS")
                .filter(|w| (1..=16).contains(w))
                .map(|w| w as u32),
            res_warps: num("RES_WARPS")
                .filter(|&w| w >= 1 && w <= u32::MAX as usize)
                .map(|w| w as u32),
            add_norm_chunks: num("ADD_NORM_CHUNKS"),
            norm_add_chunks: num("NORM_ADD_CHUNKS"),
            attn_min_chunk: num("ATTN_MIN_CHUNK").filter(|&v| v >= 32 && v % 32 == 0),
            gemm_tile: var("GEMM_TILE").filter(|v| !v.is_empty()),
            gemm_scratch_bytes: num("GEMM_SCRATCH_MB")
                .filter(|&mb| mb > 0)
                .map_or(d.gemm_scratch_bytes, |mb| mb << 20),
            prefill_chunk: num("PREFILL_CHUNK")
                .filter(|&n| n > 0)
                .unwrap_or(d.prefill_chunk),
            snapshot_every: num("SNAPSHOT_EVERY")
                .filter(|&n| n > 0)
                .unwrap_or(d.snapshot_every),
            snapshot_keep: num("SNAPSHOT_KEEP").unwrap_or(d.snapshot_keep),
            #[cfg(feature = "profiling")]
            profiling: Profiling {
                graph_skip: var("GRAPH_SKIP")
                    .map(|v| {
                        v.split(',')
                            .map(str::trim)
                            .filter(|p| !p.is_empty())
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default(),
                replay_repeat: num("REPLAY_REPEAT").unwrap_or(1).max(1),
                graph_dump: var("GRAPH_DUMP").is_some_and(|v| !v.is_empty() && v != "0"),
                dev_defines: var("DEV_DEFINES").unwrap_or_default(),
            },
        }
    }

    /// The settings that differ from the defaults, as `name=value` (empty: all defaults).
    pub fn changed(&self) -> Vec<String> {
        let d = Tuning::default();
        let a = format!("{self:?}");
        let b = format!("{d:?}");
        // field by field through Debug: `name: value` pairs in declaration order
        fields(&a)
            .into_iter()
            .zip(fields(&b))
            .filter(|(x, y)| x != y)
            .map(|(x, _)| x.replacen(": ", "=", 1))
            .collect()
    }
}

/// The top-level `name: value` pairs of a `Debug` struct rendering.
fn fields(debug: &str) -> Vec<String> {
    let inner = debug
        .split_once(" { ")
        .map_or("", |(_, r)| r.strip_suffix(" }").unwrap_or(r));
    let (mut out, mut depth, mut cur) = (Vec::new(), 0i32, String::new());
    let (mut quoted, mut escaped) = (false, false);
    for c in inner.chars() {
        if quoted {
            quoted = escaped || c != '"';
            escaped = !escaped && c == '\\';
            cur.push(c);
            continue;
        }
        match c {
            '"' => quoted = true,
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

impl fmt::Display for Tuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.changed();
        if c.is_empty() {
            write!(f, "tuning: defaults")
        } else {
            write!(f, "tuning: {}", c.join(", "))
        }
    }
}

static TUNING: OnceLock<Tuning> = OnceLock::new();

/// The process's settings: those given to [`init`], else the environment's (read on first use).
pub fn get() -> &'static Tuning {
    TUNING.get_or_init(Tuning::from_env)
}

/// Fix the process's settings (at start-up, before any backend runs); false when they were
/// already read.
pub fn init(t: Tuning) -> bool {
    TUNING.set(t).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Tuning {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (format!("FUCINA_{k}"), v.to_string()))
            .collect();
        Tuning::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn unset_is_default() {
        assert_eq!(with(&[]), Tuning::default());
        assert!(Tuning::default().changed().is_empty());
    }

    #[test]
    fn switches_and_values_parse() {
        let t = with(&[
            ("PIPELINE", "0"),
            ("NO_PDL", "1"),
            ("ATTN_MMA", " 0 "),
            ("REPACK", "1"),
            ("DEFER_NORM", "glu"),
            ("GEMV_S2", "never"),
            ("GEMV_KS", "4"),
            ("GLU_WARPS", "17"),
            ("ATTN_MIN_CHUNK", "96"),
            ("GEMM_SCRATCH_MB", "64"),
            ("PREFILL_CHUNK", "0"),
            ("SNAPSHOT_EVERY", "0"),
            ("SNAPSHOT_KEEP", "2"),
        ]);
        assert!(!t.pipeline && !t.pdl && !t.attn_mma && t.repack);
        assert_eq!(t.defer_norm, Some(DeferNorm::Glu));
        assert_eq!(t.gemv_s2, GemvS2::Never);
        assert_eq!(t.gemv_ks, Some(4));
        // out of range or malformed: the default
        assert_eq!(t.glu_warps, None);
        assert_eq!(t.attn_min_chunk, Some(96));
        assert_eq!(t.gemm_scratch_bytes, 64 << 20);
        assert_eq!(t.prefill_chunk, 8192);
        assert_eq!((t.snapshot_every, t.snapshot_keep), (256, 2));
        assert_eq!(with(&[("ATTN_MIN_CHUNK", "40")]).attn_min_chunk, None);
    }

    #[test]
    fn changed_names_the_differences() {
        let t = with(&[("MOE_FUSED", "0"), ("GEMM_TILE", "a, {b\\\"")]);
        assert_eq!(
            t.changed(),
            vec![
                "moe_fused=false".to_string(),
                "gemm_tile=Some(\"a, {b\\\\\\\"\")".to_string()
            ]
        );
        assert_eq!(
            with(&[("MOE_FUSED", "0")]).to_string(),
            "tuning: moe_fused=false"
        );
    }
}

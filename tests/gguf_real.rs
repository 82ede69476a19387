//! The real Gemma 3 270M Q4_K_M GGUF (fetched by `scripts/fetch-assets.sh`) read by fucina agrees
//! with the `gguf` Python package's reading of it: every metadata key, type and value (arrays
//! by sha256), every tensor's dims, type and offset, and the first 64 rows of every tensor
//! dequantised bit for bit (sha256). Oracle: golden/quant/summarize_gguf.py.

use std::path::PathBuf;

use fucina::arch::{self, Arch};
use fucina::gguf::{GgufValue, GgufValueType};
use fucina::weights::Checkpoint;
use sha2::{Digest, Sha256};

fn asset(name: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var_os("FUCINA_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/assets"));
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-assets.sh (or set FUCINA_TEST_ASSETS)",
        p.display()
    );
    p
}

fn type_name(t: GgufValueType) -> &'static str {
    use GgufValueType::*;
    match t {
        U8 => "UINT8",
        I8 => "INT8",
        U16 => "UINT16",
        I16 => "INT16",
        U32 => "UINT32",
        I32 => "INT32",
        F32 => "FLOAT32",
        Bool => "BOOL",
        String => "STRING",
        Array => "ARRAY",
        U64 => "UINT64",
        I64 => "INT64",
        F64 => "FLOAT64",
    }
}

fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn array_sha(a: &[GgufValue]) -> String {
    let mut h = Sha256::new();
    for (i, v) in a.iter().enumerate() {
        match v {
            GgufValue::String(s) => {
                if i > 0 {
                    h.update([0u8]);
                }
                h.update(s.as_bytes());
            }
            GgufValue::U8(x) => h.update([*x]),
            GgufValue::I8(x) => h.update([*x as u8]),
            GgufValue::Bool(x) => h.update([*x as u8]),
            GgufValue::U16(x) => h.update(x.to_le_bytes()),
            GgufValue::I16(x) => h.update(x.to_le_bytes()),
            GgufValue::U32(x) => h.update(x.to_le_bytes()),
            GgufValue::I32(x) => h.update(x.to_le_bytes()),
            GgufValue::F32(x) => h.update(x.to_le_bytes()),
            GgufValue::U64(x) => h.update(x.to_le_bytes()),
            GgufValue::I64(x) => h.update(x.to_le_bytes()),
            GgufValue::F64(x) => h.update(x.to_le_bytes()),
            GgufValue::Array(_) => panic!("nested array"),
        }
    }
    hex(h.finalize())
}

#[test]
fn gguf_real_gemma3_270m_matches_gguf_py() {
    let summary: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("golden/quant/gemma-3-270m-q4_k_m.summary.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let ckpt = Checkpoint::open(&asset("gemma-3-270m-q4_k_m.gguf")).unwrap();
    assert_eq!(arch::detect(&ckpt).unwrap().arch, Arch::Gemma3);
    let g = ckpt.gguf().unwrap();
    assert_eq!(g.version() as u64, summary["version"].as_u64().unwrap());

    let meta = summary["metadata"].as_object().unwrap();
    assert_eq!(g.metadata().len(), meta.len());
    for (key, want) in meta {
        let v = g.get(key).unwrap_or_else(|| panic!("{key} missing"));
        assert_eq!(type_name(v.value_type()), want["type"], "{key}");
        match v {
            GgufValue::Array(a) => {
                assert_eq!(a.len() as u64, want["len"].as_u64().unwrap(), "{key}");
                if let Some(first) = a.first() {
                    assert_eq!(type_name(first.value_type()), want["elem"], "{key}");
                }
                assert_eq!(array_sha(a), want["sha256"].as_str().unwrap(), "{key}");
            }
            GgufValue::String(s) => assert_eq!(s, want["value"].as_str().unwrap(), "{key}"),
            GgufValue::Bool(b) => assert_eq!(*b, want["value"].as_bool().unwrap(), "{key}"),
            GgufValue::F32(x) => assert_eq!(*x as f64, want["value"].as_f64().unwrap(), "{key}"),
            GgufValue::F64(x) => assert_eq!(*x, want["value"].as_f64().unwrap(), "{key}"),
            other => assert_eq!(
                other.as_i64().unwrap(),
                want["value"].as_i64().unwrap(),
                "{key}"
            ),
        }
    }

    let tensors = summary["tensors"].as_array().unwrap();
    assert_eq!(g.tensor_infos().len(), tensors.len());
    let mut types = std::collections::BTreeSet::new();
    for (info, want) in g.tensor_infos().iter().zip(tensors) {
        let name = want["name"].as_str().unwrap();
        assert_eq!(info.name, name);
        let ne: Vec<u64> = want["ne"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(info.dims, ne, "{name}");
        assert_eq!(info.ty.name(), want["type"].as_str().unwrap(), "{name}");
        assert_eq!(info.abs_offset, want["offset"].as_u64().unwrap(), "{name}");
        types.insert(info.ty.name());
        let t = ckpt.tensor(name).unwrap();
        let rows = want["rows_hashed"].as_u64().unwrap() as usize;
        assert_eq!(rows, t.rows().min(64), "{name}");
        let mut out = vec![0f32; rows * t.cols()];
        t.dequantize_rows(0, rows, &mut out).unwrap();
        let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(
            hex(Sha256::digest(&bytes)),
            want["sha256"].as_str().unwrap(),
            "{name}: dequantised rows differ"
        );
    }
    // the file exercises these block types
    assert_eq!(
        types.into_iter().collect::<Vec<_>>(),
        ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]
    );
    // PyTorch order: token_embd is [vocab, hidden]
    assert_eq!(
        ckpt.tensor("token_embd.weight").unwrap().shape,
        vec![262144, 640]
    );
}

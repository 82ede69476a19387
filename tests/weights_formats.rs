//! Quantised safetensors tensors whose scale siblings are missing, mis-shaped or mistyped give
//! typed errors, never a panic or an out-of-bounds read.

mod weights_common;

use fucina::weights::{Checkpoint, TensorFormat, WeightsError};
use weights_common::{f32s, St};

/// One change to a tensor's header entry.
type Edit = Box<dyn Fn(&mut serde_json::Value)>;

fn open(st: St) -> (tempfile::TempDir, Checkpoint) {
    let d = tempfile::tempdir().unwrap();
    st.write(&d.path().join("model.safetensors"));
    let c = Checkpoint::open(d.path()).unwrap();
    (d, c)
}

fn invalid(c: &Checkpoint, name: &str, want: &str) {
    match c.tensor(name) {
        Err(e @ WeightsError::Invalid { .. }) => {
            assert!(e.to_string().contains(want), "{name}: {e}")
        }
        Err(e) => panic!("{name}: unexpected error {e}"),
        Ok(t) => panic!("{name}: accepted as {:?}", t.format),
    }
}

#[test]
fn weights_formats_bad_scale_siblings() {
    let (_d, c) = open(
        St::new()
            // NVFP4 without the global scale
            .t("a.weight", "U8", &[16, 8], vec![0; 128])
            .t("a.weight_scale", "F8_E4M3", &[16, 1], vec![0x38; 16])
            // NVFP4 with too few block scales
            .t("b.weight", "U8", &[16, 8], vec![0; 128])
            .t("b.weight_scale", "F8_E4M3", &[15, 1], vec![0x38; 15])
            .t("b.weight_scale_2", "F32", &[], f32s(&[1.0]))
            // NVFP4 scale in the wrong dtype
            .t("c.weight", "U8", &[16, 8], vec![0; 128])
            .t("c.weight_scale", "F32", &[16, 1], f32s(&[1.0; 16]))
            .t("c.weight_scale_2", "F32", &[], f32s(&[1.0]))
            // FP8 with a block grid that fits no block size
            .t("d.weight", "F8_E4M3", &[300, 7], vec![0x38; 2100])
            .t("d.weight_scale_inv", "F32", &[7, 3], f32s(&[1.0; 21]))
            // FP8 with a scale of an unusable dtype
            .t("e.weight", "F8_E4M3", &[4, 4], vec![0x38; 16])
            .t("e.weight_scale", "I32", &[], vec![0; 4])
            // global scale that is not a scalar
            .t("f.weight", "U8", &[16, 8], vec![0; 128])
            .t("f.weight_scale", "F8_E4M3", &[16, 1], vec![0x38; 16])
            .t("f.weight_scale_2", "F32", &[2], f32s(&[1.0, 2.0]))
            // compressed-tensors packed weight without its global scale
            .t("g.weight_packed", "U8", &[16, 8], vec![0; 128])
            .t("g.weight_scale", "F8_E4M3", &[16, 1], vec![0x38; 16])
            // a zero reciprocal global scale would give an infinite multiplier
            .t("h.weight_packed", "U8", &[16, 8], vec![0; 128])
            .t("h.weight_scale", "F8_E4M3", &[16, 1], vec![0x38; 16])
            .t("h.weight_global_scale", "F32", &[1], f32s(&[0.0]))
            // U8 with no scales is not a weight format
            .t("i.weight", "U8", &[4], vec![0; 4]),
    );
    invalid(&c, "a.weight", "weight_scale_2");
    invalid(&c, "b.weight", "one per 16");
    invalid(&c, "c.weight", "F8_E4M3");
    invalid(&c, "d.weight", "fits no block size");
    invalid(&c, "e.weight", "I32");
    invalid(&c, "f.weight", "single value");
    invalid(&c, "g.weight", "weight_global_scale");
    invalid(&c, "h.weight", "not finite");
    invalid(&c, "i.weight", "U8");
}

#[test]
fn weights_formats_block_size_from_config_and_shapes() {
    let d = tempfile::tempdir().unwrap();
    St::new()
        // 64x64 blocks announced by config.json
        .t("a.weight", "F8_E4M3", &[130, 64], vec![0x38; 130 * 64])
        .t("a.weight_scale_inv", "F32", &[3, 1], f32s(&[1.0, 2.0, 4.0]))
        // no config entry: an exact division of the shape
        .t("b.weight", "F8_E4M3", &[32, 32], vec![0x38; 1024])
        .t("b.weight_scale_inv", "F32", &[2, 4], f32s(&[1.0; 8]))
        .write(&d.path().join("model.safetensors"));
    weights_common::write_json(
        &d.path().join("config.json"),
        serde_json::json!({"model_type": "qwen3", "quantization_config": {"weight_block_size": [64, 64]}}),
    );
    let c = Checkpoint::open(d.path()).unwrap();
    let a = c.tensor("a.weight").unwrap();
    assert_eq!(
        a.format,
        TensorFormat::Fp8 {
            block_rows: 64,
            block_cols: 64
        }
    );
    let v = a.to_f32().unwrap();
    assert_eq!((v[0], v[64 * 64], v[129 * 64]), (1.0, 2.0, 4.0));
    let b = c.tensor("b.weight").unwrap();
    assert_eq!(
        b.format,
        TensorFormat::Fp8 {
            block_rows: 16,
            block_cols: 8
        }
    );
}

/// Rewrite the header of a safetensors image with `edit` applied to one entry.
fn with_entry(bytes: &[u8], name: &str, edit: &dyn Fn(&mut serde_json::Value)) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut h[name]);
    let mut hb = serde_json::to_vec(&h).unwrap();
    while hb.len() % 8 != 0 {
        hb.push(b' ');
    }
    let mut out = (hb.len() as u64).to_le_bytes().to_vec();
    out.extend(hb);
    out.extend(&bytes[8 + n..]);
    out
}

/// Header edits that keep every byte range valid but lie about dtypes and shapes (same byte
/// size): opening and dequantising every tensor must give values or typed errors, never panic.
#[test]
fn weights_formats_lying_headers_never_panic() {
    let golden = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/quant/fp");
    let bytes = std::fs::read(golden.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let same_size = |d: &str| -> Vec<&'static str> {
        match d {
            "F8_E4M3" | "U8" | "I8" => vec!["F8_E4M3", "U8", "I8", "BOOL", "F8_E5M2"],
            "F32" | "I32" | "U32" => vec!["F32", "I32", "U32"],
            "BF16" | "F16" | "I16" => vec!["BF16", "F16", "I16"],
            _ => vec![],
        }
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(golden.join("config.json"), dir.path().join("config.json")).unwrap();
    let mut variants = 0;
    let mut errors = 0;
    for (name, entry) in header.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        let shape: Vec<u64> = entry["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        let numel: u64 = shape.iter().product();
        let mut edits: Vec<Edit> = Vec::new();
        for d in same_size(entry["dtype"].as_str().unwrap()) {
            edits.push(Box::new(move |e| e["dtype"] = d.into()));
        }
        let mut rev = shape.clone();
        rev.reverse();
        for s in [vec![numel], vec![1, numel], vec![numel, 1], rev, vec![]] {
            if s.iter().product::<u64>() == numel {
                edits.push(Box::new(move |e| e["shape"] = serde_json::json!(s)));
            }
        }
        for edit in &edits {
            std::fs::write(
                dir.path().join("model.safetensors"),
                with_entry(&bytes, name, edit.as_ref()),
            )
            .unwrap();
            let c = Checkpoint::open(dir.path()).unwrap();
            for t in c.tensor_names() {
                match c.tensor(t) {
                    Ok(r) => {
                        if r.to_f32().is_err() {
                            errors += 1;
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            variants += 1;
        }
    }
    assert!(
        variants > 60 && errors > 10,
        "{variants} variants, {errors} errors"
    );
}

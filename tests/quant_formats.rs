//! FP8 (block, per-tensor, per-row) and NVFP4 (ModelOpt, compressed-tensors) through
//! `Checkpoint`, bit for bit against numpy + ml_dtypes (`golden/quant/make_fp_vectors.py`).

use std::path::PathBuf;

use fucina::weights::{Checkpoint, TensorFormat};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/quant/fp")
}

#[test]
fn quant_formats_bit_exact_vs_ml_dtypes() {
    let c = Checkpoint::open(&dir()).unwrap();
    let e = Checkpoint::open(&dir().join("expected.safetensors")).unwrap();
    let cases = [
        (
            "blk.weight",
            TensorFormat::Fp8 {
                block_rows: 128,
                block_cols: 128,
            },
            vec![200, 136],
        ),
        (
            "blkbf.weight",
            TensorFormat::Fp8 {
                block_rows: 128,
                block_cols: 128,
            },
            vec![130, 32],
        ),
        ("mo_nvfp4.weight", TensorFormat::NvFp4, vec![48, 64]),
        (
            "mo_fp8.weight",
            TensorFormat::Fp8 {
                block_rows: 40,
                block_cols: 24,
            },
            vec![40, 24],
        ),
        ("ct_nvfp4.weight", TensorFormat::NvFp4, vec![48, 64]),
        (
            "ct_fp8.weight",
            TensorFormat::Fp8 {
                block_rows: 1,
                block_cols: 24,
            },
            vec![40, 24],
        ),
        (
            "raw8.weight",
            TensorFormat::Fp8 {
                block_rows: 8,
                block_cols: 16,
            },
            vec![8, 16],
        ),
        (
            "norm.weight",
            TensorFormat::Ggml(fucina::quant::GgmlType::BF16),
            vec![24],
        ),
    ];
    for (name, format, shape) in cases {
        let t = c.tensor(name).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(t.format, format, "{name}");
        assert_eq!(t.shape, shape, "{name}");
        let got = t.to_f32().unwrap();
        let want = e.tensor(name).unwrap().to_f32().unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        let bad: Vec<usize> = (0..got.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .collect();
        assert!(
            bad.is_empty(),
            "{name}: {} differ, first {:?}",
            bad.len(),
            bad.first().map(|&i| (i, got[i], want[i]))
        );
        assert!(got.iter().any(|v| *v != 0.0), "{name}: all zero");
    }
    assert_eq!(c.quant_method(), Some("fp8"));
    // the NVFP4 global multipliers: ModelOpt stores it, compressed-tensors stores its reciprocal
    let mo = c.tensor("mo_nvfp4.weight").unwrap();
    let ct = c.tensor("ct_nvfp4.weight").unwrap();
    assert!(mo.scales.global.unwrap() < 0.1 && ct.scales.global.unwrap() < 0.1);
}

#[test]
fn quant_formats_listing_hides_attached_scales() {
    let c = Checkpoint::open(&dir()).unwrap();
    let mut names = c.tensor_names();
    names.sort();
    assert_eq!(
        names,
        [
            "blk.weight",
            "blkbf.weight",
            "ct_fp8.weight",
            "ct_nvfp4.weight",
            "mo_fp8.input_scale",
            "mo_fp8.weight",
            "mo_nvfp4.input_scale",
            "mo_nvfp4.weight",
            "norm.weight",
            "raw8.weight"
        ]
    );
    assert!(
        c.has("ct_nvfp4.weight")
            && c.has("ct_nvfp4.weight_packed")
            && c.has("blk.weight_scale_inv")
    );
    // scales stay readable by their own names
    assert_eq!(c.tensor("blk.weight_scale_inv").unwrap().shape, vec![2, 2]);
}

#[test]
fn quant_e4m3_encoder_matches_ml_dtypes() {
    use fucina::weights::safetensors::SafetensorsFile;
    let f = SafetensorsFile::open(&dir().join("e4m3_encode.safetensors")).unwrap();
    let x = f.data(f.get("x").unwrap());
    let code = f.data(f.get("code").unwrap());
    assert_eq!(x.len(), code.len() * 4);
    let mut bad = Vec::new();
    for (i, c) in x.chunks_exact(4).zip(code) {
        let v = f32::from_le_bytes([i[0], i[1], i[2], i[3]]);
        let got = fucina::quant::f32_to_e4m3(v);
        if got != *c {
            bad.push((v, got, *c));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} differ, e.g. {:?}",
        bad.len(),
        code.len(),
        &bad[..bad.len().min(5)]
    );
}

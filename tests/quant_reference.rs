//! GGML block dequantisation, bit for bit against the `gguf` Python package (0.19.0).
//! Vectors: `golden/quant/make_vectors.py` -> golden/quant/{blocks,expected}.gguf.

use std::path::PathBuf;

use fucina::gguf::{GgufFile, GgufValue};
use fucina::quant::GgmlType;
use fucina::weights::TensorFormat;

fn golden(name: &str) -> GgufFile {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden/quant")
        .join(name);
    GgufFile::open(&p).unwrap_or_else(|e| panic!("{e} (run golden/quant/make_vectors.py)"))
}

const TYPES: [(&str, GgmlType); 11] = [
    ("F32", GgmlType::F32),
    ("F16", GgmlType::F16),
    ("BF16", GgmlType::BF16),
    ("Q4_0", GgmlType::Q4_0),
    ("Q4_1", GgmlType::Q4_1),
    ("Q5_0", GgmlType::Q5_0),
    ("Q5_1", GgmlType::Q5_1),
    ("Q8_0", GgmlType::Q8_0),
    ("Q4_K", GgmlType::Q4K),
    ("Q5_K", GgmlType::Q5K),
    ("Q6_K", GgmlType::Q6K),
];

#[test]
fn quant_every_block_type_bit_exact_vs_gguf_py() {
    let blocks = golden("blocks.gguf");
    let expected = golden("expected.gguf");
    for (name, ty) in TYPES {
        let t = blocks
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        let e = expected.tensor(name).unwrap();
        assert_eq!(t.format, TensorFormat::Ggml(ty), "{name}");
        assert_eq!(t.shape, e.shape, "{name}: shape");
        assert_eq!(
            t.shape[0],
            if ty.block().0 == 256 || ty.block().0 == 1 {
                4
            } else {
                8
            },
            "{name}: rows"
        );
        let got = t.to_f32().unwrap();
        let want = e.to_f32().unwrap();
        assert_eq!(got.len(), want.len());
        let bad: Vec<usize> = (0..got.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .collect();
        assert!(
            bad.is_empty(),
            "{name}: {} of {} values differ, first at {}: got {} want {}",
            bad.len(),
            got.len(),
            bad[0],
            got[bad[0]],
            want[bad[0]]
        );
        // row-wise dequantisation agrees with the whole-tensor one
        let cols = t.cols();
        let mut row = vec![0f32; cols];
        t.dequantize_rows(t.rows() - 1, 1, &mut row).unwrap();
        assert_eq!(row, got[got.len() - cols..], "{name}: last row");
    }
}

#[test]
fn quant_reader_reads_gguf_py_metadata_zoo() {
    let g = golden("blocks.gguf");
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture(), Some("fucina-quant-vectors"));
    assert_eq!(g.get("zoo.u8"), Some(&GgufValue::U8(200)));
    assert_eq!(g.get("zoo.i8"), Some(&GgufValue::I8(-5)));
    assert_eq!(g.get("zoo.u16"), Some(&GgufValue::U16(65000)));
    assert_eq!(g.get("zoo.i16"), Some(&GgufValue::I16(-30000)));
    assert_eq!(g.get("zoo.u32"), Some(&GgufValue::U32(4_000_000_000)));
    assert_eq!(g.get("zoo.i32"), Some(&GgufValue::I32(-2_000_000_000)));
    assert_eq!(g.get("zoo.f32"), Some(&GgufValue::F32(1.5)));
    assert_eq!(g.get("zoo.u64"), Some(&GgufValue::U64(u64::MAX - 1)));
    assert_eq!(g.get("zoo.i64"), Some(&GgufValue::I64(-(1 << 62))));
    assert_eq!(g.get("zoo.f64"), Some(&GgufValue::F64(-2.25)));
    assert_eq!(g.get_bool("zoo.bool"), Some(true));
    assert_eq!(g.get_str("zoo.str"), Some("héllo ✓ 日本"));
    let strs: Vec<&str> = g
        .get_array("zoo.strs")
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(strs, ["a", "", "<s>"]);
    assert_eq!(
        g.get_array("zoo.ints")
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect::<Vec<_>>(),
        [1, -2, 3]
    );
    let nested = g.get_array("zoo.nested").unwrap();
    assert_eq!(nested.len(), 2);
    assert_eq!(
        nested[0]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(g.tensor_infos().len(), 11);
}

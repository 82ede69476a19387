//! safetensors files: plain dtypes, header validation against hostile input.

mod weights_common;

use fucina::quant::GgmlType;
use fucina::weights::safetensors::{parse_header, SafetensorsFile};
use fucina::weights::{Checkpoint, TensorFormat, WeightsError};
use weights_common::{bf16s, f16s, f32s, St};

#[test]
fn safetensors_plain_dtypes_read_through_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.safetensors");
    St::new()
        .t(
            "a.weight",
            "F32",
            &[2, 3],
            f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        )
        .t("b", "BF16", &[4], bf16s(&[1.0, -0.5, 3.0, 256.0]))
        .t("c", "F16", &[2], f16s(&[0.25, -8.0]))
        .t("s", "F32", &[], f32s(&[7.0]))
        .t("ids", "I64", &[2], vec![0; 16])
        .write(&p);
    let c = Checkpoint::open(&p).unwrap();
    assert!(c.gguf().is_none());
    assert_eq!(c.dir(), Some(dir.path()));
    let a = c.tensor("a.weight").unwrap();
    assert_eq!(a.shape, vec![2, 3]);
    assert_eq!(a.format, TensorFormat::Ggml(GgmlType::F32));
    assert_eq!(a.to_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = c.tensor("b").unwrap();
    assert_eq!(b.format, TensorFormat::Ggml(GgmlType::BF16));
    assert_eq!(b.to_f32().unwrap(), vec![1.0, -0.5, 3.0, 256.0]);
    assert_eq!(c.tensor("c").unwrap().to_f32().unwrap(), vec![0.25, -8.0]);
    assert_eq!(c.tensor("s").unwrap().to_f32().unwrap(), vec![7.0]);
    let e = c.tensor("ids").unwrap_err().to_string();
    assert!(e.contains("I64"), "{e}");
    assert!(matches!(c.tensor("zzz"), Err(WeightsError::Missing(_))));
    let mut names = c.tensor_names();
    names.sort();
    assert_eq!(names, vec!["a.weight", "b", "c", "ids", "s"]);
    let f = SafetensorsFile::open(&p).unwrap();
    assert_eq!(f.metadata().get("format").map(String::as_str), Some("pt"));
}

fn header_file(header: &str, data_len: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(vec![0u8; data_len]);
    out
}

#[test]
fn safetensors_hostile_headers_are_errors() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "shorter"),
        ("short", vec![1, 2, 3], "shorter"),
        (
            "huge header length",
            u64::MAX.to_le_bytes().to_vec(),
            "header length",
        ),
        (
            "header past end",
            {
                let mut v = 100u64.to_le_bytes().to_vec();
                v.extend(b"{}");
                v
            },
            "header length",
        ),
        ("not json", header_file("{nope", 0), "JSON"),
        ("not object", header_file("[1,2]", 0), "object"),
        (
            "no dtype",
            header_file(r#"{"a":{"shape":[1],"data_offsets":[0,4]}}"#, 4),
            "dtype",
        ),
        (
            "bad shape",
            header_file(
                r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
                4,
            ),
            "shape",
        ),
        (
            "overflow shape",
            header_file(
                r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}"#,
                4,
            ),
            "overflow",
        ),
        (
            "offsets reversed",
            header_file(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#,
                4,
            ),
            "outside",
        ),
        (
            "offsets past end",
            header_file(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                3,
            ),
            "outside",
        ),
        (
            "size mismatch",
            header_file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
                8,
            ),
            "needs",
        ),
        (
            "one offset",
            header_file(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#, 4),
            "two integers",
        ),
        (
            "overlap",
            header_file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                8,
            ),
            "overlap",
        ),
        (
            "bad metadata",
            header_file(r#"{"__metadata__":{"k":1}}"#, 0),
            "__metadata__",
        ),
    ];
    for (what, bytes, want) in cases {
        let e = parse_header(&bytes)
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(e.contains(want), "{what}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.safetensors");
    std::fs::write(&p, header_file("{nope", 0)).unwrap();
    let e = Checkpoint::open(&p).unwrap_err();
    assert!(matches!(e, WeightsError::Safetensors { .. }), "{e}");
    // unknown dtypes are kept but unreadable
    let (t, _) = parse_header(&header_file(
        r#"{"a":{"dtype":"F6_E9M9","shape":[3],"data_offsets":[0,5]}}"#,
        5,
    ))
    .unwrap();
    assert_eq!(t.len(), 1);
}

#[test]
fn safetensors_every_truncation_is_an_error() {
    let full = St::new()
        .f32("a", &[3], &[1.0, 2.0, 3.0])
        .f32("b", &[2], &[4.0, 5.0])
        .build();
    assert!(parse_header(&full).is_ok());
    for n in 0..full.len() {
        assert!(
            parse_header(&full[..n]).is_err(),
            "truncated to {n} bytes accepted"
        );
    }
}

#[test]
fn safetensors_byte_mutations_never_panic() {
    let full = St::new()
        .t("a.weight", "F8_E4M3", &[4, 32], vec![0x38; 128])
        .t("a.weight_scale", "F32", &[], f32s(&[0.5]))
        .t("b", "BF16", &[3], bf16s(&[1.0, 2.0, 3.0]))
        .build();
    let n = u64::from_le_bytes(full[..8].try_into().unwrap()) as usize;
    let mut rejected = 0;
    for pos in 0..8 + n {
        for v in [b'0', b'9', b'"', b'[', b'-', 0xff, full[pos] ^ 1] {
            let mut m = full.clone();
            m[pos] = v;
            if parse_header(&m).is_err() {
                rejected += 1;
            }
        }
    }
    assert!(rejected > n, "only {rejected} mutations rejected");
}

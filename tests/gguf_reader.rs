//! GGUF reader: every metadata type, nested arrays, alignment, tensor infos, and `tensor()`.

mod gguf_common;

use fucina::arch::{self, Arch, Layout};
use fucina::gguf::{GgufFile, GgufValue};
use fucina::quant::GgmlType;
use fucina::weights::{Checkpoint, TensorFormat};
use gguf_common::{f32_bytes, sample, Writer};

fn check_sample(g: &GgufFile, version: u32) {
    assert_eq!(g.version(), version);
    assert_eq!(g.architecture(), Some("gemma3"));
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_offset() % 64, 0);
    assert_eq!(g.get("t.u8"), Some(&GgufValue::U8(200)));
    assert_eq!(g.get("t.i8"), Some(&GgufValue::I8(-5)));
    assert_eq!(g.get("t.u16"), Some(&GgufValue::U16(65000)));
    assert_eq!(g.get("t.i16"), Some(&GgufValue::I16(-30000)));
    assert_eq!(g.get_u64("t.u32"), Some(4_000_000_000));
    assert_eq!(g.get_i64("t.i32"), Some(-2_000_000_000));
    assert_eq!(g.get_u64("t.i32"), None, "negative is not a u64");
    assert_eq!(g.get_f32("t.f32"), Some(1.5));
    assert_eq!(g.get_bool("t.bool"), Some(true));
    assert_eq!(g.get_str("t.str"), Some("héllo ✓"));
    assert_eq!(g.get_u64("t.u64"), Some(u64::MAX - 1));
    assert_eq!(g.get_i64("t.i64"), Some(i64::MIN + 1));
    assert_eq!(g.get_f32("t.f64"), Some(-2.25));
    assert_eq!(
        g.get_array("t.arr").unwrap(),
        &[GgufValue::I32(1), GgufValue::I32(-2), GgufValue::I32(3)]
    );
    let strs: Vec<&str> = g
        .get_array("t.strs")
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(strs, ["a", "", "<s>"]);
    let nested = g.get_array("t.nested").unwrap();
    assert_eq!(nested.len(), 3);
    assert_eq!(
        nested[0].as_array().unwrap(),
        &[GgufValue::U8(1), GgufValue::U8(2)]
    );
    assert_eq!(nested[2].as_array().unwrap().len(), 0);
    assert_eq!(g.get_array("t.empty").unwrap().len(), 0);
    assert_eq!(g.metadata().len(), 18);
    assert!(g.get("absent").is_none());

    let infos = g.tensor_infos();
    assert_eq!(infos.len(), 3);
    assert_eq!(infos[1].dims, vec![3, 2]);
    assert_eq!(infos[1].shape(), vec![2, 3]);

    let v = g.tensor("vec").unwrap();
    assert_eq!(v.shape, vec![5]);
    assert_eq!(v.to_f32().unwrap(), vec![1.0, -2.0, 3.5, 0.0, 9.0]);
    let m = g.tensor("mat").unwrap();
    assert_eq!(m.shape, vec![2, 3], "PyTorch order: ne reversed");
    assert_eq!(m.format, TensorFormat::Ggml(GgmlType::F32));
    assert_eq!(m.to_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let q = g.tensor("q8").unwrap();
    assert_eq!(q.shape, vec![2, 32]);
    assert_eq!(q.format, TensorFormat::Ggml(GgmlType::Q8_0));
    assert_eq!(q.data.len(), 68);
    let f = q.to_f32().unwrap();
    assert_eq!(f[0], 0.25 * -16.0);
    assert_eq!(f[32 + 31], 0.5 * 15.0);
    assert!(g.tensor("nope").is_none());
}

#[test]
fn gguf_v3_every_value_type_roundtrips() {
    let g = GgufFile::from_bytes(sample(3).build()).unwrap();
    check_sample(&g, 3);
}

#[test]
fn gguf_v2_every_value_type_roundtrips() {
    let g = GgufFile::from_bytes(sample(2).build()).unwrap();
    check_sample(&g, 2);
}

#[test]
fn gguf_open_mmaps_file_and_checkpoint_wraps_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, sample(3).build()).unwrap();
    let g = GgufFile::open(&p).unwrap();
    check_sample(&g, 3);
    assert_eq!(g.path(), Some(p.as_path()));

    for path in [p.clone(), dir.path().to_path_buf()] {
        let c = Checkpoint::open(&path).unwrap();
        check_sample(c.gguf().unwrap(), 3);
        assert_eq!(c.dir(), Some(dir.path()));
        assert!(c.config().is_none());
        assert!(c.has("mat") && !c.has("nope"));
        assert_eq!(c.tensor_names(), vec!["vec", "mat", "q8"]);
        assert_eq!(c.tensor("mat").unwrap().shape, vec![2, 3]);
        assert!(matches!(
            c.tensor("nope"),
            Err(fucina::weights::WeightsError::Missing(_))
        ));
        let d = arch::detect(&c).unwrap();
        assert_eq!(
            (d.arch, d.layout, d.text_prefix.as_str()),
            (Arch::Gemma3, Layout::Gguf, "")
        );
    }
}

#[test]
fn gguf_default_alignment_is_32() {
    let w = Writer::new(3)
        .kv("general.architecture", GgufValue::String("qwen3".into()))
        .tensor("a", &[3], 0, f32_bytes(&[1.0, 2.0, 3.0]))
        .tensor("b", &[1], 0, f32_bytes(&[7.0]));
    let g = GgufFile::from_bytes(w.build()).unwrap();
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.tensor_infos()[1].offset, 32);
    assert_eq!(g.tensor("b").unwrap().to_f32().unwrap(), vec![7.0]);
}

#[test]
fn gguf_detects_every_architecture_name() {
    let cases = [
        ("gemma3", Arch::Gemma3),
        ("gemma4", Arch::Gemma4),
        ("gemma4-assistant", Arch::Gemma4Assistant),
        ("gemma4_assistant", Arch::Gemma4Assistant),
        ("qwen3", Arch::Qwen3),
        ("qwen3moe", Arch::Qwen3Moe),
        ("qwen35", Arch::Qwen35),
        ("qwen35moe", Arch::Qwen35Moe),
        ("diffusion-gemma", Arch::DiffusionGemma),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, want) in cases {
        let p = dir.path().join(format!("{name}.gguf"));
        std::fs::write(
            &p,
            Writer::new(3)
                .kv("general.architecture", GgufValue::String(name.into()))
                .build(),
        )
        .unwrap();
        let d = arch::detect(&Checkpoint::open(&p).unwrap()).unwrap();
        assert_eq!(d.arch, want, "{name}");
    }
    for a in Arch::ALL {
        assert_eq!(Arch::from_gguf(a.name()), Some(a));
    }
    let p = dir.path().join("llama.gguf");
    std::fs::write(
        &p,
        Writer::new(3)
            .kv("general.architecture", GgufValue::String("llama".into()))
            .build(),
    )
    .unwrap();
    let e = arch::detect(&Checkpoint::open(&p).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"llama\"") && e.contains("qwen35moe") && e.contains("gemma4-assistant"),
        "{e}"
    );
    let p = dir.path().join("none.gguf");
    std::fs::write(&p, Writer::new(3).build()).unwrap();
    let e = arch::detect(&Checkpoint::open(&p).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("general.architecture"), "{e}");
}

fn split_part(i: u16, tensor: &str, v: f32) -> Writer {
    let mut w = Writer::new(3)
        .kv("split.no", GgufValue::U16(i - 1))
        .kv("split.count", GgufValue::U16(3));
    if i == 1 {
        w = w.kv("general.architecture", GgufValue::String("qwen3moe".into()));
    }
    w.tensor(tensor, &[1], 0, f32_bytes(&[v]))
}

#[test]
fn gguf_split_files_open_as_one_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let name = |i: u16| dir.path().join(format!("m-{i:05}-of-00003.gguf"));
    for (i, t) in [(1u16, "a"), (2, "b"), (3, "c")] {
        std::fs::write(name(i), split_part(i, t, i as f32).build()).unwrap();
    }
    for p in [name(2), name(1), dir.path().to_path_buf()] {
        let c = Checkpoint::open(&p).unwrap();
        assert_eq!(c.files().len(), 3);
        assert_eq!(c.tensor_names(), vec!["a", "b", "c"]);
        assert_eq!(c.tensor("c").unwrap().to_f32().unwrap(), vec![3.0]);
        assert!(c.has("b"));
        assert_eq!(c.gguf().unwrap().architecture(), Some("qwen3moe"));
        assert_eq!(arch::detect(&c).unwrap().arch, Arch::Qwen3Moe);
    }
    // a tensor in two parts
    std::fs::write(name(3), split_part(3, "a", 3.0).build()).unwrap();
    let e = Checkpoint::open(&name(1)).unwrap_err().to_string();
    assert!(e.contains("more than one part"), "{e}");
    // a missing part
    std::fs::remove_file(name(3)).unwrap();
    let e = Checkpoint::open(&name(1)).unwrap_err().to_string();
    assert!(
        e.contains("m-00003-of-00003.gguf") && e.contains("missing"),
        "{e}"
    );
    // split.count disagreeing with the parts found
    let d2 = tempfile::tempdir().unwrap();
    let w = Writer::new(3).kv("split.count", GgufValue::U16(5));
    std::fs::write(d2.path().join("x-00001-of-00001.gguf"), w.build()).unwrap();
    let e = Checkpoint::open(d2.path()).unwrap_err().to_string();
    assert!(e.contains("split.count"), "{e}");
}

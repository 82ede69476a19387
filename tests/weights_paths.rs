//! Checkpoint locations: folders, sharded indexes, HF cache snapshots and parents,
//! `--local-dir` downloads; config.json architecture detection for both HF layouts.

mod weights_common;

use std::path::Path;

use fucina::arch::{self, Arch, Layout};
use fucina::weights::{Checkpoint, WeightsError};
use serde_json::json;
use weights_common::{write_json, St};

fn text_model(dir: &Path, prefix: &str) {
    St::new()
        .f32(
            &format!("{prefix}embed_tokens.weight"),
            &[2, 2],
            &[1.0, 2.0, 3.0, 4.0],
        )
        .f32(
            &format!("{prefix}layers.0.input_layernorm.weight"),
            &[2],
            &[0.5, 0.25],
        )
        .f32("lm_head.weight", &[2, 2], &[0.0; 4])
        .write(&dir.join("model.safetensors"));
}

#[test]
fn weights_dir_with_model_safetensors_and_config() {
    let d = tempfile::tempdir().unwrap();
    text_model(d.path(), "model.");
    write_json(
        &d.path().join("config.json"),
        json!({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}),
    );
    let c = Checkpoint::open(d.path()).unwrap();
    assert_eq!(c.dir(), Some(d.path()));
    assert_eq!(c.config().unwrap()["model_type"], "qwen3");
    assert_eq!(
        c.tensor("model.embed_tokens.weight")
            .unwrap()
            .to_f32()
            .unwrap(),
        vec![1.0, 2.0, 3.0, 4.0]
    );
    let det = arch::detect(&c).unwrap();
    assert_eq!(
        (det.arch, det.layout, det.text_prefix.as_str()),
        (Arch::Qwen3, Layout::HfText, "model.")
    );
}

#[test]
fn weights_detects_text_and_multimodal_layouts() {
    let cases: Vec<(serde_json::Value, &str, Arch, Layout)> = vec![
        (
            json!({"model_type": "gemma3_text"}),
            "model.",
            Arch::Gemma3,
            Layout::HfText,
        ),
        (
            json!({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}}),
            "model.language_model.",
            Arch::Gemma3,
            Layout::HfMultimodal,
        ),
        (
            json!({"model_type": "gemma3"}),
            "language_model.model.",
            Arch::Gemma3,
            Layout::HfMultimodal,
        ),
        (
            json!({"model_type": "gemma4", "text_config": {"model_type": "gemma4_text"}}),
            "model.language_model.",
            Arch::Gemma4,
            Layout::HfMultimodal,
        ),
        (
            json!({"model_type": "gemma4_text"}),
            "model.",
            Arch::Gemma4,
            Layout::HfText,
        ),
        (
            json!({"model_type": "gemma4_assistant"}),
            "model.",
            Arch::Gemma4Assistant,
            Layout::HfText,
        ),
        (
            json!({"model_type": "qwen3_moe"}),
            "model.",
            Arch::Qwen3Moe,
            Layout::HfText,
        ),
        (
            json!({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text"}}),
            "model.language_model.",
            Arch::Qwen35,
            Layout::HfMultimodal,
        ),
        (
            json!({"model_type": "qwen3_5_text"}),
            "model.",
            Arch::Qwen35,
            Layout::HfText,
        ),
        (
            json!({"model_type": "qwen3_5_moe"}),
            "model.language_model.",
            Arch::Qwen35Moe,
            Layout::HfMultimodal,
        ),
        (
            json!({"model_type": "qwen3_5_moe_text"}),
            "model.",
            Arch::Qwen35Moe,
            Layout::HfText,
        ),
        (
            json!({"model_type": "diffusion_gemma"}),
            "model.encoder.language_model.",
            Arch::DiffusionGemma,
            Layout::HfMultimodal,
        ),
        // unknown wrapper type, known text_config type
        (
            json!({"model_type": "something_vl", "text_config": {"model_type": "qwen3_5_text"}}),
            "model.language_model.",
            Arch::Qwen35,
            Layout::HfMultimodal,
        ),
        // no model_type: the architectures class decides
        (
            json!({"architectures": ["Qwen3_5MoeForConditionalGeneration"]}),
            "model.language_model.",
            Arch::Qwen35Moe,
            Layout::HfMultimodal,
        ),
    ];
    for (cfg, prefix, want, layout) in cases {
        let d = tempfile::tempdir().unwrap();
        text_model(d.path(), prefix);
        write_json(&d.path().join("config.json"), cfg.clone());
        let det = arch::detect(&Checkpoint::open(d.path()).unwrap()).unwrap();
        assert_eq!(
            (det.arch, det.layout, det.text_prefix.as_str()),
            (want, layout, prefix),
            "{cfg}"
        );
    }
    for a in Arch::ALL {
        assert_eq!(Arch::from_model_type(a.hf_model_type()), Some(a));
    }
}

#[test]
fn weights_unsupported_config_names_what_it_found() {
    let d = tempfile::tempdir().unwrap();
    text_model(d.path(), "model.");
    write_json(
        &d.path().join("config.json"),
        json!({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}),
    );
    let e = arch::detect(&Checkpoint::open(d.path()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"llama\"") && e.contains("LlamaForCausalLM") && e.contains("qwen3_5_text"),
        "{e}"
    );
    std::fs::remove_file(d.path().join("config.json")).unwrap();
    let e = arch::detect(&Checkpoint::open(d.path()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("config.json"), "{e}");
    std::fs::write(d.path().join("config.json"), "{not json").unwrap();
    assert!(matches!(
        Checkpoint::open(d.path()),
        Err(WeightsError::Json { .. })
    ));
}

fn sharded(dir: &Path) {
    St::new()
        .f32("model.embed_tokens.weight", &[2], &[1.0, 2.0])
        .write(&dir.join("model-00001-of-00002.safetensors"));
    St::new()
        .f32("model.layers.0.mlp.down_proj.weight", &[1], &[3.0])
        .f32("lm_head.weight", &[1], &[4.0])
        .write(&dir.join("model-00002-of-00002.safetensors"));
    write_json(
        &dir.join("model.safetensors.index.json"),
        json!({"metadata": {"total_size": 16}, "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.layers.0.mlp.down_proj.weight": "model-00002-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors"}}),
    );
    write_json(&dir.join("config.json"), json!({"model_type": "qwen3"}));
}

#[test]
fn weights_sharded_index() {
    let d = tempfile::tempdir().unwrap();
    sharded(d.path());
    for p in [
        d.path().to_path_buf(),
        d.path().join("model.safetensors.index.json"),
    ] {
        let c = Checkpoint::open(&p).unwrap();
        assert_eq!(c.files().len(), 2);
        assert_eq!(
            c.tensor("lm_head.weight").unwrap().to_f32().unwrap(),
            vec![4.0]
        );
        assert_eq!(
            c.tensor("model.embed_tokens.weight")
                .unwrap()
                .to_f32()
                .unwrap(),
            vec![1.0, 2.0]
        );
        assert_eq!(c.tensor_names().len(), 3);
        assert_eq!(c.config().unwrap()["model_type"], "qwen3");
    }
    // a shard named by the index is missing
    std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn weights_sharded_index_inconsistent_or_escaping() {
    let d = tempfile::tempdir().unwrap();
    sharded(d.path());
    let idx = d.path().join("model.safetensors.index.json");
    write_json(
        &idx,
        json!({"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}),
    );
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("lm_head.weight") && e.contains("does not hold"),
        "{e}"
    );
    write_json(
        &idx,
        json!({"weight_map": {"lm_head.weight": "../etc/passwd"}}),
    );
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(e.contains("leaves the checkpoint folder"), "{e}");
    write_json(
        &idx,
        json!({"weight_map": {"lm_head.weight": "/etc/passwd"}}),
    );
    assert!(Checkpoint::open(d.path()).is_err());
    write_json(&idx, json!({"nothing": 1}));
    assert!(matches!(
        Checkpoint::open(d.path()),
        Err(WeightsError::Json { .. })
    ));
    // the same tensor in two shards
    std::fs::remove_file(&idx).unwrap();
    St::new()
        .f32("lm_head.weight", &[1], &[9.0])
        .write(&d.path().join("extra.safetensors"));
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(e.contains("more than one shard"), "{e}");
}

#[test]
fn weights_glob_of_safetensors_without_index() {
    let d = tempfile::tempdir().unwrap();
    St::new()
        .f32("a", &[1], &[1.0])
        .write(&d.path().join("part-b.safetensors"));
    St::new()
        .f32("b", &[1], &[2.0])
        .write(&d.path().join("part-a.safetensors"));
    let c = Checkpoint::open(d.path()).unwrap();
    assert_eq!(c.tensor("a").unwrap().to_f32().unwrap(), vec![1.0]);
    assert_eq!(c.tensor("b").unwrap().to_f32().unwrap(), vec![2.0]);
    assert!(c.config().is_none());
}

/// models--org--name/{refs/main, blobs/, snapshots/<rev>/...} with snapshot files as symlinks.
fn hf_cache(root: &Path, revs: &[&str], main: Option<&str>) -> std::path::PathBuf {
    let parent = root.join("models--org--name");
    std::fs::create_dir_all(parent.join("blobs")).unwrap();
    for rev in revs {
        let snap = parent.join("snapshots").join(rev);
        std::fs::create_dir_all(&snap).unwrap();
        let blob = parent.join("blobs").join(format!("w-{rev}"));
        St::new()
            .f32("model.embed_tokens.weight", &[1], &[rev.len() as f32])
            .write(&blob);
        std::os::unix::fs::symlink(
            format!("../../blobs/w-{rev}"),
            snap.join("model.safetensors"),
        )
        .unwrap();
        write_json(
            &snap.join("config.json"),
            json!({"model_type": "gemma3_text"}),
        );
        std::fs::write(snap.join("tokenizer.json"), "{}").unwrap();
    }
    if let Some(m) = main {
        std::fs::create_dir_all(parent.join("refs")).unwrap();
        std::fs::write(parent.join("refs").join("main"), format!("{m}\n")).unwrap();
    }
    parent
}

#[test]
fn weights_hf_cache_snapshot_and_parent() {
    let d = tempfile::tempdir().unwrap();
    let parent = hf_cache(d.path(), &["aaaa", "bbbbbbb"], Some("bbbbbbb"));
    let snap = parent.join("snapshots").join("bbbbbbb");
    for p in [parent.clone(), snap.clone(), parent.join("snapshots")] {
        let c = Checkpoint::open(&p).unwrap();
        assert_eq!(c.dir(), Some(snap.as_path()), "{p:?}");
        assert!(c.dir().unwrap().join("tokenizer.json").is_file());
        assert_eq!(
            c.tensor("model.embed_tokens.weight")
                .unwrap()
                .to_f32()
                .unwrap(),
            vec![7.0]
        );
        assert_eq!(arch::detect(&c).unwrap().arch, Arch::Gemma3);
    }
    // an explicit snapshot other than refs/main still loads
    let c = Checkpoint::open(&parent.join("snapshots").join("aaaa")).unwrap();
    assert_eq!(
        c.tensor("model.embed_tokens.weight")
            .unwrap()
            .to_f32()
            .unwrap(),
        vec![4.0]
    );
    // refs/main naming a missing snapshot
    std::fs::write(parent.join("refs").join("main"), "cccc").unwrap();
    let e = Checkpoint::open(&parent).unwrap_err().to_string();
    assert!(e.contains("cccc"), "{e}");
    std::fs::write(parent.join("refs").join("main"), "../../x").unwrap();
    assert!(Checkpoint::open(&parent).is_err());
    // no refs/main: two snapshots are ambiguous
    std::fs::remove_file(parent.join("refs").join("main")).unwrap();
    let e = Checkpoint::open(&parent).unwrap_err().to_string();
    assert!(e.contains("2 snapshots"), "{e}");
}

#[test]
fn weights_hf_cache_parent_single_snapshot_without_refs() {
    let d = tempfile::tempdir().unwrap();
    let parent = hf_cache(d.path(), &["abc"], None);
    let c = Checkpoint::open(&parent).unwrap();
    assert_eq!(
        c.dir(),
        Some(parent.join("snapshots").join("abc").as_path())
    );
}

#[test]
fn weights_local_dir_download() {
    // `huggingface-cli download --local-dir X` leaves a hidden .cache folder beside the files
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join(".cache/huggingface/download")).unwrap();
    std::fs::write(
        d.path()
            .join(".cache/huggingface/download/model.safetensors.metadata"),
        "x",
    )
    .unwrap();
    sharded(d.path());
    std::fs::write(d.path().join("tokenizer.json"), "{}").unwrap();
    let c = Checkpoint::open(d.path()).unwrap();
    assert_eq!(c.dir(), Some(d.path()));
    assert_eq!(arch::detect(&c).unwrap().arch, Arch::Qwen3);
}

#[test]
fn weights_missing_and_empty_locations() {
    let d = tempfile::tempdir().unwrap();
    let e = Checkpoint::open(&d.path().join("nope")).unwrap_err();
    assert!(matches!(e, WeightsError::Io { .. }), "{e}");
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(e.contains("no model.safetensors.index.json"), "{e}");
    std::fs::write(d.path().join("a.gguf"), b"GGUF").unwrap();
    std::fs::write(d.path().join("b.gguf"), b"GGUF").unwrap();
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(e.contains("a.gguf") && e.contains("b.gguf"), "{e}");
    // a truncated GGUF surfaces the GGUF error
    let e = Checkpoint::open(&d.path().join("a.gguf")).unwrap_err();
    assert!(matches!(e, WeightsError::Gguf(_)), "{e}");
}

#[test]
fn weights_checkpoint_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Checkpoint>();
    check::<fucina::gguf::GgufFile>();
    check::<fucina::weights::TensorRef<'static>>();
}

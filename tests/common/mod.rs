//! Test doubles for server mechanics: a byte-level tokenizer with ChatML markers and a scripted
//! `CausalLm` whose greedy output is fixed by keywords in the prompt. Not a model: the real-model
//! server tests live in tests/server_real.rs.
#![allow(dead_code)]

pub mod http;

use std::sync::Arc;
use std::time::Duration;

use fucina::model::{CausalLm, Logits, ModelError, ModelInfo, Session};
use fucina::tokenizer::{SpecialTokens, Tokenizer};
use serde_json::json;

pub const EOT: u32 = 258; // <|im_end|>
pub const SPECIALS: [&str; 7] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
];

/// GPT-2's byte -> printable char map.
fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        out[*b as usize] = char::from_u32(c).unwrap();
    }
    out
}

/// Byte-level tokenizer: id = byte value for 0..256, then the ChatML / Qwen markers.
pub fn tokenizer() -> Tokenizer {
    build_tokenizer(&SPECIALS, vec![256, EOT])
}

/// Byte-level tokenizer with no special tokens at all (for the tiny golden models' 256-entry
/// vocabularies).
pub fn byte_tokenizer() -> Tokenizer {
    build_tokenizer(&[], Vec::new())
}

fn build_tokenizer(specials: &[&str], eos: Vec<u32>) -> Tokenizer {
    let chars = byte_chars();
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..256).map(|b| (chars[b].to_string(), json!(b))).collect();
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": 256 + i, "content": s, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": i < 3})
        })
        .collect();
    let spec = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    let inner: tokenizers::Tokenizer = spec.to_string().parse().expect("test tokenizer");
    Tokenizer::from_tokenizers(
        inner,
        SpecialTokens {
            bos: None,
            eos,
            pad: None,
        },
    )
}

pub const REPLY_DEFAULT: &str = "Hello from the test model.";
pub const REPLY_TOOL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
pub const REPLY_THINK: &str = "<think>\nLet me think.\n</think>\n\nThe answer is 4.";

/// Scripted model: after each prompt it greedily writes a reply chosen by a keyword of the
/// prompt (TOOLCALL, QUOTEDTOOL, THINK, FOREVER; otherwise [`REPLY_DEFAULT`]), then
/// `<|im_end|>`. QUOTEDTOOL writes a tool call whose argument value is the text `</tool_call>`
/// written as ordinary tokens (bytes), between the control tokens that open and close the call.
pub struct ScriptedLm {
    info: ModelInfo,
    tok: Arc<Tokenizer>,
    pub delay: Duration,
}

impl ScriptedLm {
    pub fn new(max_context: usize, delay: Duration) -> Arc<Self> {
        let tok = Arc::new(tokenizer());
        Arc::new(Self {
            info: ModelInfo {
                kv_fixed_elems: 0,
                kv_elems_per_token: 0,
                arch: "scripted".into(),
                vocab_size: 256 + SPECIALS.len(),
                hidden_size: 8,
                max_context,
            },
            tok,
            delay,
        })
    }
}

impl CausalLm for ScriptedLm {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn new_session(self: Arc<Self>) -> Box<dyn Session> {
        Box::new(ScriptedSession {
            lm: self,
            toks: Vec::new(),
            prompt_end: 0,
            reset: true,
            script: Vec::new(),
        })
    }
}

struct ScriptedSession {
    lm: Arc<ScriptedLm>,
    toks: Vec<u32>,
    prompt_end: usize,
    reset: bool,
    script: Vec<u32>,
}

impl ScriptedSession {
    fn choose_script(&mut self) {
        let text: Vec<u8> = self
            .toks
            .iter()
            .filter(|&&t| t < 256)
            .map(|&t| t as u8)
            .collect();
        let has = |k: &str| text.windows(k.len()).any(|w| w == k.as_bytes());
        if has("QUOTEDTOOL") {
            let t = &self.lm.tok;
            self.script = [
                t.encode(
                    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"",
                    false,
                )
                .unwrap(),
                t.encode_text("</tool_call>", false).unwrap(),
                t.encode("\"}}\n</tool_call>", false).unwrap(),
            ]
            .concat();
            return;
        }
        let reply = if has("TOOLCALL") {
            REPLY_TOOL.to_string()
        } else if has("THINK") {
            REPLY_THINK.to_string()
        } else if has("FOREVER") {
            "ab ".repeat(100_000)
        } else {
            REPLY_DEFAULT.to_string()
        };
        self.script = self.lm.tok.encode(&reply, false).unwrap();
    }

    fn next_logits(&self) -> Vec<f32> {
        let v = self.lm.info.vocab_size;
        let k = self.toks.len() - self.prompt_end;
        let next = self.script.get(k).copied().unwrap_or(EOT);
        let mut l = vec![0.0f32; v];
        l[next as usize] = 10.0;
        l[(next as usize + 1) % 256] = 8.0;
        l
    }
}

impl Session for ScriptedSession {
    fn forward(&mut self, tokens: &[u32], all: bool) -> Result<Logits, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        if self.toks.len() + tokens.len() > self.lm.info.max_context {
            return Err(ModelError::ContextOverflow {
                len: self.toks.len() + tokens.len(),
                max: self.lm.info.max_context,
            });
        }
        if let Some(&id) = tokens
            .iter()
            .find(|&&t| t as usize >= self.lm.info.vocab_size)
        {
            return Err(ModelError::BadToken {
                id,
                vocab: self.lm.info.vocab_size,
            });
        }
        if !self.lm.delay.is_zero() {
            std::thread::sleep(self.lm.delay);
        }
        self.toks.extend_from_slice(tokens);
        if self.reset {
            self.reset = false;
            self.prompt_end = self.toks.len();
            self.choose_script();
        }
        let row = self.next_logits();
        let rows = if all { tokens.len() } else { 1 };
        let mut data = Vec::with_capacity(rows * row.len());
        for _ in 0..rows {
            data.extend_from_slice(&row);
        }
        Ok(Logits {
            rows,
            vocab: row.len(),
            data,
        })
    }
    fn len(&self) -> usize {
        self.toks.len()
    }
    fn rewind(&mut self, n: usize) -> Result<(), ModelError> {
        if n > self.toks.len() {
            return Err(ModelError::Rewind {
                to: n,
                why: "beyond the end".into(),
            });
        }
        self.toks.truncate(n);
        self.reset = true;
        Ok(())
    }
}

/// A checkpoint under the source tree (`golden/models/qwen3/model.gguf`, say) on the CPU
/// backend with a context of 256.
pub fn cpu_model(rel: &str) -> Arc<dyn CausalLm> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    let ckpt =
        fucina::weights::Checkpoint::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    fucina::model::registry::load_model(
        &ckpt,
        Arc::new(fucina::backend::cpu::CpuBackend::new()),
        &fucina::model::registry::LoadOptions {
            max_context: 256,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

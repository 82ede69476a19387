//! Finding a checkpoint's own chat template and its special-token variables:
//! `chat_template.jinja`, `chat_template.json`, `tokenizer_config.json` (string or a list of
//! named templates), or the GGUF `tokenizer.chat_template` string the caller passes in.

use std::path::Path;

use serde_json::{Map, Value};

use super::ChatError;

/// A template source and the special-token variables found next to it.
#[derive(Debug, Clone, Default)]
pub struct TemplateFiles {
    /// The default template.
    pub source: Option<String>,
    /// The `tool_use` variant, when the config names one.
    pub tool_use: Option<String>,
    /// `bos_token`, `eos_token`, `pad_token`, `unk_token` as strings.
    pub special: Map<String, Value>,
}

/// Read the template files in `dir` (a checkpoint or tokenizer folder). Missing files are not
/// an error; unreadable or malformed ones are.
pub fn from_dir(dir: &Path) -> Result<TemplateFiles, ChatError> {
    let mut out = TemplateFiles::default();
    let cfg_path = dir.join("tokenizer_config.json");
    if cfg_path.is_file() {
        out = from_tokenizer_config(&read(&cfg_path)?)?;
    }
    let json_path = dir.join("chat_template.json");
    if json_path.is_file() {
        let v: Value = serde_json::from_str(&read(&json_path)?)
            .map_err(|e| ChatError::Template(format!("{}: {e}", json_path.display())))?;
        if let Some(t) = v.get("chat_template") {
            apply_template_field(t, &mut out);
        }
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        out.source = Some(read(&jinja)?);
    }
    Ok(out)
}

/// Parse a `tokenizer_config.json` text.
pub fn from_tokenizer_config(text: &str) -> Result<TemplateFiles, ChatError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ChatError::Template(format!("tokenizer_config.json: {e}")))?;
    let mut out = TemplateFiles::default();
    if let Some(t) = v.get("chat_template") {
        apply_template_field(t, &mut out);
    }
    for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
        let tok = match v.get(key) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(o)) => o
                .get("content")
                .and_then(|c| c.as_str())
                .map(str::to_string),
            _ => None,
        };
        if let Some(t) = tok {
            out.special.insert(key.into(), Value::String(t));
        }
    }
    Ok(out)
}

fn apply_template_field(t: &Value, out: &mut TemplateFiles) {
    match t {
        Value::String(s) => out.source = Some(s.clone()),
        Value::Array(list) => {
            for item in list {
                let name = item.get("name").and_then(|n| n.as_str());
                let tmpl = item
                    .get("template")
                    .and_then(|n| n.as_str())
                    .map(str::to_string);
                match name {
                    Some("default") => out.source = tmpl,
                    Some("tool_use") => out.tool_use = tmpl,
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

fn read(p: &Path) -> Result<String, ChatError> {
    std::fs::read_to_string(p)
        .map_err(|e| ChatError::Template(format!("reading {}: {e}", p.display())))
}

//! Python-compatible rendering of template values, so prompts match what Hugging Face's Jinja
//! environment produces byte for byte:
//! - `tojson` is `json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)`
//!   (default separators `", "` / `": "`, no HTML escaping — unlike minijinja's own `tojson`);
//! - printing `None`, `True`, `False`, lists and dicts uses Python's `str()` forms.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};

/// Options of `json.dumps`.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        Self {
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

impl DumpOptions {
    /// Python's defaults for a given indent: with an indent the item separator loses its space.
    pub fn with_indent(indent: Option<String>) -> Self {
        let item_sep = if indent.is_some() { "," } else { ", " };
        Self {
            indent,
            item_sep: item_sep.into(),
            ..Default::default()
        }
    }
}

/// `json.dumps` of a template value.
pub fn dumps(v: &Value, o: &DumpOptions) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    dump(v, o, 0, &mut out)?;
    Ok(out)
}

fn dump(
    v: &Value,
    o: &DumpOptions,
    level: usize,
    out: &mut String,
) -> Result<(), minijinja::Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(v)),
        ValueKind::String => json_str(v.as_str().unwrap_or(""), out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            container(out, o, level, '[', ']', &items, |item, out| {
                dump(item, o, level + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if o.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            container(out, o, level, '{', '}', &keys, |k, out| {
                match k.as_str() {
                    Some(s) => json_str(s, out),
                    None => json_str(&k.to_string(), out),
                }
                out.push_str(&o.key_sep);
                dump(&v.get_item(k)?, o, level + 1, out)
            })?;
        }
        _ => json_str(&v.to_string(), out),
    }
    Ok(())
}

fn container(
    out: &mut String,
    o: &DumpOptions,
    level: usize,
    open: char,
    close: char,
    items: &[Value],
    mut each: impl FnMut(&Value, &mut String) -> Result<(), minijinja::Error>,
) -> Result<(), minijinja::Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&o.item_sep);
        }
        if let Some(ind) = &o.indent {
            out.push('\n');
            out.push_str(&ind.repeat(level + 1));
        }
        each(item, out)?;
    }
    if let Some(ind) = &o.indent {
        out.push('\n');
        out.push_str(&ind.repeat(level));
    }
    out.push(close);
    Ok(())
}

/// Python's number formatting (`repr` of int / float).
fn number(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    py_float(f)
}

/// `repr(float)`: shortest round-trip digits, `.0` on integral values, `e+XX` exponents.
pub fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Scientific: Python writes 1e+20, 1.5e-07.
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let e: i32 = exp.parse().unwrap_or(0);
        let sign = if e < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", e.abs());
    }
    let s = format!("{f:?}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

/// A JSON string literal with `ensure_ascii=False` escaping.
pub fn json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `str()` of a value, as Jinja prints it.
pub fn py_str(v: &Value) -> Option<String> {
    match v.kind() {
        ValueKind::None => Some("None".into()),
        ValueKind::Bool => Some(if v.is_true() { "True" } else { "False" }.into()),
        ValueKind::Number if !v.is_integer() => {
            Some(py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN)))
        }
        ValueKind::Seq | ValueKind::Map => {
            let mut out = String::new();
            py_repr(v, &mut out);
            Some(out)
        }
        _ => None,
    }
}

fn py_repr(v: &Value, out: &mut String) {
    match v.kind() {
        ValueKind::String => {
            let s = v.as_str().unwrap_or("");
            let q = if s.contains('\'') && !s.contains('"') {
                '"'
            } else {
                '\''
            };
            out.push(q);
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if c == q => {
                        out.push('\\');
                        out.push(c);
                    }
                    c => out.push(c),
                }
            }
            out.push(q);
        }
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&item, out);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, k) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&k, out);
                out.push_str(": ");
                py_repr(&v.get_item(&k).unwrap_or_default(), out);
            }
            out.push('}');
        }
        ValueKind::Undefined => out.push_str("None"),
        _ => out.push_str(&py_str(v).unwrap_or_else(|| v.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(j: &str) -> Value {
        Value::from_serialize(serde_json::from_str::<serde_json::Value>(j).unwrap())
    }

    // Expected strings are what CPython 3.11's json.dumps / str() print for the same input.
    #[test]
    fn dumps_matches_python() {
        let x = v(r#"{"b": [1, 2.5, null, true], "a": "é\n\"<>&", "c": {}}"#);
        assert_eq!(
            dumps(&x, &DumpOptions::default()).unwrap(),
            r#"{"b": [1, 2.5, null, true], "a": "é\n\"<>&", "c": {}}"#
        );
        assert_eq!(
            dumps(&x, &DumpOptions::with_indent(Some("  ".into()))).unwrap(),
            "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": \"é\\n\\\"<>&\",\n  \"c\": {}\n}"
        );
        assert_eq!(py_float(1e20), "1e+20");
        assert_eq!(py_float(3.0), "3.0");
        assert_eq!(py_float(1.5e-7), "1.5e-07");
    }

    #[test]
    fn str_matches_python() {
        assert_eq!(
            py_str(&v(r#"{"a": [1, "it's", null, false]}"#)).unwrap(),
            r#"{'a': [1, "it's", None, False]}"#
        );
    }
}

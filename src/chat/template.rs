//! Rendering a model's own Jinja chat template the way Hugging Face transformers does
//! (`apply_chat_template`): `trim_blocks` + `lstrip_blocks`, loop controls, Python string
//! methods (minijinja-contrib pycompat), `raise_exception`, `strftime_now`, a Python-exact
//! `tojson`, and Python's printing of `None`/`True`/`False`/lists/dicts.

use std::sync::Arc;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};

use super::pyjson::{self, DumpOptions};
use super::ChatError;

/// Everything a template render takes besides the template.
#[derive(Debug, Clone, Default)]
pub struct RenderInput {
    /// OpenAI-shaped messages (`role`, `content`, `tool_calls`, `reasoning_content`, ...).
    pub messages: Vec<serde_json::Value>,
    /// OpenAI-shaped tool definitions (`{"type": "function", "function": {...}}`), if any.
    pub tools: Option<Vec<serde_json::Value>>,
    pub add_generation_prompt: bool,
    /// Extra variables (`enable_thinking`, `chat_template_kwargs` contents, ...).
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// A compiled chat template plus the special-token variables it is rendered with.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    /// `bos_token`, `eos_token`, ... as `tokenizer.special_tokens_map` gives them.
    special: serde_json::Map<String, serde_json::Value>,
    source: Arc<str>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("chars", &self.source.len())
            .finish()
    }
}

impl ChatTemplate {
    /// Compile `source`. `special` holds the special-token variables (`bos_token`, ...).
    pub fn new(
        source: &str,
        special: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_filter("fucina_gemma4", gemma4_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.set_formatter(|out, state, value| match pyjson::py_str(value) {
            Some(s) => out.write_str(&s).map_err(Error::from),
            None => minijinja::escape_formatter(out, state, value),
        });
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| ChatError::Template(format!("compiling the chat template: {e:#}")))?;
        Ok(Self {
            env: Arc::new(env),
            special,
            source: source.into(),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render the prompt text.
    pub fn render(&self, input: &RenderInput) -> Result<String, ChatError> {
        let mut ctx = self.special.clone();
        ctx.insert(
            "messages".into(),
            serde_json::Value::Array(input.messages.clone()),
        );
        ctx.insert(
            "tools".into(),
            input
                .tools
                .clone()
                .map(serde_json::Value::Array)
                .unwrap_or(serde_json::Value::Null),
        );
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            input.add_generation_prompt.into(),
        );
        for (k, v) in &input.kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ChatError::Template(e.to_string()))?;
        tmpl.render(Value::from_serialize(&ctx)).map_err(|e| {
            // raise_exception's message is the useful part.
            let msg = match e.kind() {
                ErrorKind::InvalidOperation => e.detail().unwrap_or("").to_string(),
                _ => String::new(),
            };
            if msg.is_empty() {
                ChatError::Template(format!("rendering the chat template: {e}"))
            } else {
                ChatError::Template(msg)
            }
        })
    }
}

fn tojson(value: &Value, args: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = args.get("indent")?;
    let sort_keys: Option<bool> = args.get("sort_keys")?;
    let separators: Option<Value> = args.get("separators")?;
    let _: Option<Value> = args.get("ensure_ascii")?;
    args.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let mut o = DumpOptions::with_indent(indent);
    o.sort_keys = sort_keys.unwrap_or(false);
    if let Some(seps) = separators {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        if let [a, b] = parts.as_slice() {
            o.item_sep = a.as_str().unwrap_or(",").to_string();
            o.key_sep = b.as_str().unwrap_or(":").to_string();
        }
    }
    Ok(Value::from_safe_string(pyjson::dumps(value, &o)?))
}

/// Gemma 4 value syntax (used by the built-in Gemma 4 template). JSON strings are parsed first.
fn gemma4_filter(value: &Value) -> Result<Value, Error> {
    let mut v = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    if let serde_json::Value::String(s) = &v {
        if let Ok(parsed @ serde_json::Value::Object(_)) = serde_json::from_str(s) {
            v = parsed;
        }
    }
    Ok(Value::from_safe_string(super::gemma4_args::to_gemma4(&v)))
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(secs, &fmt)
}

/// `time.strftime` over a UTC timestamp, for the directives chat templates use.
pub fn strftime(unix: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix.div_euclid(86400);
    let sod = unix.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    let wd = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let (hh, mm, ss) = (sod / 3600, sod / 60 % 60, sod % 60);
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') => match it.next() {
                Some('d') => out.push_str(&d.to_string()),
                Some('m') => out.push_str(&m.to_string()),
                Some(o) => out.push_str(&format!("%-{o}")),
                None => out.push_str("%-"),
            },
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') | Some('h') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[wd]),
            Some('a') => out.push_str(&DAYS[wd][..3]),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", if hh % 12 == 0 { 12 } else { hh % 12 })),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 -> (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        // 2024-02-29 13:05:09 UTC was a Thursday (date -u -d @1709211909).
        assert_eq!(
            strftime(1709211909, "%d %b %Y %A %H:%M:%S %j"),
            "29 Feb 2024 Thursday 13:05:09 060"
        );
        assert_eq!(strftime(0, "%B %-d, %Y"), "January 1, 1970");
    }

    #[test]
    fn raise_exception_surfaces_message() {
        let t = ChatTemplate::new(
            "{{ raise_exception('roles must alternate') }}",
            Default::default(),
        )
        .unwrap();
        match t.render(&RenderInput::default()) {
            Err(ChatError::Template(m)) => assert_eq!(m, "roles must alternate"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn python_printing_and_loop_controls() {
        let src = "{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}|{{ none }}|{{ true }}|{{ {'a': [1]} }}|{{ ' x '.strip() }}|{{ {'k': 'é<'} | tojson }}";
        let t = ChatTemplate::new(src, Default::default()).unwrap();
        assert_eq!(
            t.render(&RenderInput::default()).unwrap(),
            "13|None|True|{'a': [1]}|x|{\"k\": \"é<\"}"
        );
    }
}

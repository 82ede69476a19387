//! Gemma 4's native value syntax in tool declarations, calls and responses: JSON-like objects
//! with bare keys (`{city:<|"|>Paris<|"|>,days:3}`), strings delimited by `<|"|>`.
//! Converted to and from `serde_json::Value`.

use serde_json::{Map, Number, Value};

/// The string delimiter token.
pub const QUOTE: &str = "<|\"|>";

/// Render a JSON value in Gemma 4 syntax.
pub fn to_gemma4(v: &Value) -> String {
    let mut out = String::new();
    write(v, &mut out);
    out
}

fn write(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => {
            out.push_str(QUOTE);
            out.push_str(s);
            out.push_str(QUOTE);
        }
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(k);
                out.push(':');
                write(x, out);
            }
            out.push('}');
        }
    }
}

/// Parse a Gemma 4 value; the whole input must be consumed (trailing whitespace allowed).
pub fn parse(src: &str) -> Result<Value, String> {
    let mut p = Parser { s: src, i: 0 };
    let v = p.value()?;
    p.ws();
    if p.i != src.len() {
        return Err(format!("unexpected trailing text at byte {}", p.i));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a str,
    i: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.s[self.i..]
    }
    fn ws(&mut self) {
        let r = self.rest();
        self.i += r.len() - r.trim_start().len();
    }
    fn eat(&mut self, t: &str) -> bool {
        if self.rest().starts_with(t) {
            self.i += t.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        self.ws();
        if self.eat(QUOTE) {
            return self.string();
        }
        if self.eat("{") {
            return self.object();
        }
        if self.eat("[") {
            return self.array();
        }
        if self.rest().starts_with('"') {
            // Plain JSON string (tolerated).
            let mut de = serde_json::Deserializer::from_str(self.rest()).into_iter::<Value>();
            return match de.next() {
                Some(Ok(v)) => {
                    self.i += de.byte_offset();
                    Ok(v)
                }
                _ => Err("bad string".into()),
            };
        }
        let end = self
            .rest()
            .find(|c: char| c == ',' || c == '}' || c == ']' || c.is_whitespace())
            .unwrap_or(self.rest().len());
        let word = &self.rest()[..end];
        let v = match word {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" | "None" => Value::Null,
            w => {
                if let Ok(i) = w.parse::<i64>() {
                    Value::Number(i.into())
                } else if let Some(n) = w.parse::<f64>().ok().and_then(Number::from_f64) {
                    Value::Number(n)
                } else if w.is_empty() {
                    return Err(format!("expected a value at byte {}", self.i));
                } else {
                    Value::String(w.to_string()) // bare word: keep as text
                }
            }
        };
        self.i += end;
        Ok(v)
    }

    fn string(&mut self) -> Result<Value, String> {
        match self.rest().find(QUOTE) {
            Some(n) => {
                let s = self.rest()[..n].to_string();
                self.i += n + QUOTE.len();
                Ok(Value::String(s))
            }
            None => Err("unterminated <|\"|> string".into()),
        }
    }

    fn object(&mut self) -> Result<Value, String> {
        let mut m = Map::new();
        loop {
            self.ws();
            if self.eat("}") {
                return Ok(Value::Object(m));
            }
            let key = if self.eat(QUOTE) {
                match self.string()? {
                    Value::String(s) => s,
                    _ => unreachable!(),
                }
            } else if self.rest().starts_with('"') {
                match self.value()? {
                    Value::String(s) => s,
                    _ => return Err("bad key".into()),
                }
            } else {
                let end = self.rest().find(':').ok_or("expected ':' after a key")?;
                let k = self.rest()[..end].trim().to_string();
                self.i += end;
                k
            };
            self.ws();
            if !self.eat(":") {
                return Err(format!("expected ':' at byte {}", self.i));
            }
            let v = self.value()?;
            m.insert(key, v);
            self.ws();
            if !self.eat(",") {
                self.ws();
                if self.eat("}") {
                    return Ok(Value::Object(m));
                }
                return Err(format!("expected ',' or '}}' at byte {}", self.i));
            }
        }
    }

    fn array(&mut self) -> Result<Value, String> {
        let mut items = Vec::new();
        loop {
            self.ws();
            if self.eat("]") {
                return Ok(Value::Array(items));
            }
            items.push(self.value()?);
            self.ws();
            if !self.eat(",") {
                self.ws();
                if self.eat("]") {
                    return Ok(Value::Array(items));
                }
                return Err(format!("expected ',' or ']' at byte {}", self.i));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let v: Value = serde_json::from_str(
            r#"{"city":"Paris, \"FR\"","days":3,"x":1.5,"ok":true,"tags":["a",null],"n":{"k":{}}}"#,
        )
        .unwrap();
        let g = to_gemma4(&v);
        assert_eq!(
            g,
            r#"{city:<|"|>Paris, "FR"<|"|>,days:3,x:1.5,ok:true,tags:[<|"|>a<|"|>,null],n:{k:{}}}"#
        );
        assert_eq!(parse(&g).unwrap(), v);
    }

    #[test]
    fn tolerant_spacing_and_errors() {
        let v = parse(r#"{ city: <|"|>Rome<|"|> , n : -2 }"#).unwrap();
        assert_eq!(v, serde_json::json!({"city": "Rome", "n": -2}));
        assert!(parse(r#"{city: <|"|>Rome"#).is_err());
        assert!(parse("{a:1} junk").is_err());
    }
}

//! The interactive REPL: line editing and history (rustyline), slash commands, reasoning shown
//! dimmed, the conversation kept between turns (the engine reuses its KV prefix).

use std::path::PathBuf;

use anyhow::{Context, Result};
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use serde_json::{json, Value};

use super::load::Ready;
use super::turn::{self, TurnOpts, TurnResult, DIM, RESET};
use crate::server::params::ThinkingLevel;

const HELP: &str = "commands:
  /thinking LEVEL   off | on | low | mid | high | xhigh
  /reset            forget the conversation
  /stats            statistics of the last turn
  /save NAME        save the conversation (needs --session-dir)
  /load NAME        load a saved conversation (needs --session-dir)
  /help             this text
  /quit             exit (Ctrl-D too)";

/// What a slash command asks for.
#[derive(Debug, PartialEq)]
pub enum Cmd {
    Thinking(Option<ThinkingLevel>),
    Reset,
    Stats,
    Save(String),
    Load(String),
    Help,
    Quit,
    Unknown(String),
}

pub fn parse_command(line: &str) -> Option<Cmd> {
    let line = line.trim();
    let rest = line.strip_prefix('/')?;
    let (cmd, arg) = rest
        .split_once(char::is_whitespace)
        .map(|(c, a)| (c, a.trim()))
        .unwrap_or((rest, ""));
    Some(match cmd {
        "thinking" | "think" => Cmd::Thinking(ThinkingLevel::parse(arg)),
        "reset" | "clear" => Cmd::Reset,
        "stats" => Cmd::Stats,
        "save" => Cmd::Save(arg.to_string()),
        "load" => Cmd::Load(arg.to_string()),
        "help" | "?" => Cmd::Help,
        "quit" | "exit" | "q" => Cmd::Quit,
        other => Cmd::Unknown(other.to_string()),
    })
}

/// A saved-conversation path, refusing names that would escape the directory.
pub fn session_path(dir: Option<&PathBuf>, name: &str) -> Result<PathBuf, String> {
    let dir = dir.ok_or("start with --session-dir DIR to save and load conversations")?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        || name.starts_with('.')
    {
        return Err("a session name is letters, digits, '-', '_' and '.'".into());
    }
    Ok(dir.join(format!("{name}.json")))
}

pub fn run(
    ready: &Ready,
    mut opts: TurnOpts,
    system: Option<String>,
    session_dir: Option<PathBuf>,
) -> Result<()> {
    let mut rl = DefaultEditor::new().context("starting the line editor")?;
    let history = dirs::data_dir().map(|d| d.join("fucina").join("history.txt"));
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    let fresh = || -> Vec<Value> {
        system
            .iter()
            .map(|s| json!({"role": "system", "content": s}))
            .collect()
    };
    let mut messages = fresh();
    let mut last: Option<TurnResult> = None;
    println!(
        "fucina REPL: {} ({}). /help for commands, Ctrl-D to quit.",
        ready.engine.info().model_id,
        ready.engine.info().arch
    );
    loop {
        let line = match rl.readline(">>> ") {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        if line.trim().is_empty() {
            continue;
        }
        let _ = rl.add_history_entry(line.as_str());
        if let Some(cmd) = parse_command(&line) {
            match cmd {
                Cmd::Quit => break,
                Cmd::Help => println!("{HELP}"),
                Cmd::Reset => {
                    messages = fresh();
                    println!("(conversation cleared)");
                }
                Cmd::Stats => match &last {
                    Some(r) => println!("{}", r.stats_line()),
                    None => println!("(no turn yet)"),
                },
                Cmd::Thinking(Some(l)) => {
                    opts.thinking = l;
                    println!("(thinking {l:?})");
                }
                Cmd::Thinking(None) => println!("usage: /thinking off|on|low|mid|high|xhigh"),
                Cmd::Save(name) => match session_path(session_dir.as_ref(), &name) {
                    Ok(p) => {
                        match std::fs::create_dir_all(p.parent().unwrap_or(&p)).and_then(|_| {
                            std::fs::write(
                                &p,
                                serde_json::to_vec_pretty(
                                    &json!({"version": 1, "messages": messages}),
                                )?,
                            )
                        }) {
                            Ok(()) => {
                                println!("(saved {} messages to {})", messages.len(), p.display())
                            }
                            Err(e) => println!("error: {e}"),
                        }
                    }
                    Err(e) => println!("error: {e}"),
                },
                Cmd::Load(name) => match session_path(session_dir.as_ref(), &name) {
                    Ok(p) => match std::fs::read(&p).map_err(|e| e.to_string()).and_then(|b| {
                        serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string())
                    }) {
                        Ok(v) => match v.get("messages").and_then(|m| m.as_array()) {
                            Some(m) => {
                                messages = m.clone();
                                println!("(loaded {} messages)", messages.len());
                            }
                            None => println!("error: {} is not a saved conversation", p.display()),
                        },
                        Err(e) => println!("error: {e}"),
                    },
                    Err(e) => println!("error: {e}"),
                },
                Cmd::Unknown(c) => println!("unknown command /{c}; /help lists them"),
            }
            continue;
        }
        messages.push(json!({"role": "user", "content": line}));
        let mut stdout = std::io::stdout();
        match turn::run(ready, Some(&messages), None, &opts, &mut stdout) {
            Ok(r) => {
                println!();
                let mut m = json!({"role": "assistant", "content": r.content});
                if !r.reasoning.is_empty() {
                    m["reasoning_content"] = Value::String(r.reasoning.clone());
                }
                messages.push(m);
                last = Some(r);
            }
            Err(e) => {
                messages.pop();
                println!("{RESET}error: {e:#}");
            }
        }
        let _ = DIM;
    }
    if let Some(h) = &history {
        if let Some(d) = h.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        let _ = rl.save_history(h);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse() {
        assert_eq!(
            parse_command("/thinking high"),
            Some(Cmd::Thinking(Some(ThinkingLevel::High)))
        );
        assert_eq!(parse_command("/thinking bogus"), Some(Cmd::Thinking(None)));
        assert_eq!(
            parse_command("  /save my-chat "),
            Some(Cmd::Save("my-chat".into()))
        );
        assert_eq!(parse_command("/quit"), Some(Cmd::Quit));
        assert_eq!(parse_command("/wat"), Some(Cmd::Unknown("wat".into())));
        assert_eq!(parse_command("hello /reset"), None);
    }

    #[test]
    fn session_names_cannot_escape() {
        let d = PathBuf::from("/tmp/s");
        assert!(session_path(Some(&d), "../etc/passwd").is_err());
        assert!(session_path(Some(&d), ".hidden").is_err());
        assert!(session_path(None, "ok").is_err());
        assert_eq!(
            session_path(Some(&d), "chat_1").unwrap(),
            d.join("chat_1.json")
        );
    }
}

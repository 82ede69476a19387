use super::*;
use crate::chat::Dialect;

/// Feed `text` in pieces of `step` chars; merge adjacent events of one kind.
fn run(p: &mut OutputParser, text: &str, step: usize) -> Vec<ParsedEvent> {
    let chars: Vec<char> = text.chars().collect();
    let mut evs = Vec::new();
    for chunk in chars.chunks(step) {
        let s: String = chunk.iter().collect();
        for e in p.feed(&s) {
            push_merge(&mut evs, e);
        }
    }
    for e in p.finish() {
        push_merge(&mut evs, e);
    }
    evs
}

fn qwen(tools: bool, defs: &[Value]) -> OutputParser {
    OutputParser::new(Dialect::Qwen.markers(), tools, false, defs)
}

#[test]
fn qwen_thinking_split_at_every_step() {
    for step in 1..6 {
        let evs = run(
            &mut qwen(false, &[]),
            "<think>\nI ponder.\n</think>\n\nHello <b>!",
            step,
        );
        assert_eq!(
            evs,
            vec![
                ParsedEvent::Reasoning("I ponder.".into()),
                ParsedEvent::Content("Hello <b>!".into())
            ],
            "step {step}"
        );
    }
}

#[test]
fn prompt_opened_thinking() {
    let mut p = OutputParser::new(Dialect::Qwen.markers(), false, true, &[]);
    let evs = run(&mut p, "\nhmm\n</think>\n\nok", 2);
    assert_eq!(
        evs,
        vec![
            ParsedEvent::Reasoning("hmm".into()),
            ParsedEvent::Content("ok".into())
        ]
    );
}

#[test]
fn qwen_json_tool_call_never_leaks_markup() {
    let text = "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"t2\", \"arguments\": {}}\n</tool_call>";
    for step in 1..4 {
        let mut p = qwen(true, &[]);
        let mut content = String::new();
        let chars: Vec<char> = text.chars().collect();
        let mut calls = Vec::new();
        for c in chars.chunks(step) {
            for e in p.feed(&c.iter().collect::<String>()) {
                match e {
                    ParsedEvent::Content(t) => content.push_str(&t),
                    ParsedEvent::ToolCall(c) => calls.push(c),
                    ParsedEvent::Reasoning(_) => panic!(),
                }
            }
        }
        assert!(p.finish().is_empty());
        assert_eq!(content, "Sure.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(calls[1].index, 1);
        assert_eq!(calls[1].arguments, "{}");
    }
}

#[test]
fn qwen_xml_tool_call_typed_by_schema() {
    let defs = vec![
        serde_json::json!({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}, "o": {"type": "object"}}}}}),
    ];
    let text = "<tool_call>\n<function=f>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\n007\n</parameter>\n<parameter=o>\n{\"a\": [1]}\n</parameter>\n</function>\n</tool_call>";
    let evs = run(&mut qwen(true, &defs), text, 3);
    assert_eq!(
        evs,
        vec![ParsedEvent::ToolCall(ParsedToolCall {
            index: 0,
            name: "f".into(),
            arguments: r#"{"n":42,"s":"007","o":{"a":[1]}}"#.into()
        })]
    );
}

#[test]
fn gemma4_native_call_and_thinking() {
    let text = "<|channel>thought\nplan<channel|>Calling.<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|>";
    for step in 1..5 {
        let mut p = OutputParser::new(Dialect::Gemma4.markers(), true, false, &[]);
        let evs = run(&mut p, text, step);
        assert_eq!(
            evs,
            vec![
                ParsedEvent::Reasoning("plan".into()),
                ParsedEvent::Content("Calling.".into()),
                ParsedEvent::ToolCall(ParsedToolCall {
                    index: 0,
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris","days":2}"#.into()
                })
            ],
            "step {step}"
        );
    }
}

#[test]
fn no_tools_means_markup_is_content_and_bad_bodies_come_back() {
    let evs = run(&mut qwen(false, &[]), "a <tool_call>x</tool_call>", 1);
    assert_eq!(
        evs,
        vec![ParsedEvent::Content("a <tool_call>x</tool_call>".into())]
    );
    let evs = run(
        &mut qwen(true, &[]),
        "a <tool_call>not json</tool_call> b",
        2,
    );
    assert_eq!(
        evs,
        vec![ParsedEvent::Content(
            "a <tool_call>not json</tool_call> b".into()
        )]
    );
    let evs = run(&mut qwen(true, &[]), "x <tool b", 1);
    assert_eq!(evs, vec![ParsedEvent::Content("x <tool b".into())]);
}

#[test]
fn unterminated_call_at_end_is_parsed_if_complete() {
    let evs = run(
        &mut qwen(true, &[]),
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
        4,
    );
    assert!(matches!(&evs[..], [ParsedEvent::ToolCall(c)] if c.name == "f"));
}

#[test]
fn forced_tool_choice_prefills_prompt_and_primes_parser() {
    use crate::chat::{source::TemplateFiles, ChatFormat, ChatRequest, ToolChoice};
    let tools = vec![
        serde_json::json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}),
    ];
    let fmt = ChatFormat::new(Dialect::Qwen, TemplateFiles::default(), Default::default()).unwrap();
    let req = ChatRequest {
        messages: vec![serde_json::json!({"role": "user", "content": "Rome?"})],
        tools: tools.clone(),
        tool_choice: ToolChoice::Function("get_weather".into()),
        ..Default::default()
    };
    let r = fmt.render(&req).unwrap();
    assert!(
        r.text.ends_with(
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        ),
        "{}",
        r.text
    );
    assert!(!r.in_reasoning);
    let mut p = fmt.parser(&r, &tools);
    let evs = run(&mut p, "{\"city\": \"Rome\"}}\n</tool_call>", 3);
    assert_eq!(
        evs,
        vec![ParsedEvent::ToolCall(ParsedToolCall {
            index: 0,
            name: "get_weather".into(),
            arguments: r#"{"city":"Rome"}"#.into()
        })]
    );
    // tool_choice none: tools neither rendered nor parsed.
    let r = fmt
        .render(&ChatRequest {
            tool_choice: ToolChoice::None,
            ..req.clone()
        })
        .unwrap();
    assert!(!r.text.contains("# Tools") && !r.parse_tools);
    // Gemma 4 required: the native call opener.
    let g4 = ChatFormat::new(
        Dialect::Gemma4,
        TemplateFiles::default(),
        Default::default(),
    )
    .unwrap();
    let r = g4
        .render(&ChatRequest {
            tool_choice: ToolChoice::Required,
            ..req
        })
        .unwrap();
    assert!(r.text.ends_with("<|turn>model\n<|tool_call>call:"));
    let evs = run(
        &mut g4.parser(&r, &tools),
        "get_weather{city:<|\"|>Rome<|\"|>}<tool_call|>",
        2,
    );
    assert!(
        matches!(&evs[..], [ParsedEvent::ToolCall(c)] if c.name == "get_weather" && c.arguments == r#"{"city":"Rome"}"#)
    );
}

//! Behaviour tests for `OutputParser`, including chunking invariance.

use m3_serve::{Event, Finish, OutputParser, ParserOptions, Tags, ToolCall, ToolSchemas};
use proptest::prelude::*;
use serde_json::{json, Value};

/// Everything a client would end up with.
#[derive(Debug, Clone, PartialEq)]
struct Summary {
    reasoning: String,
    content: String,
    calls: Vec<ToolCall>,
    finish_tail: Finish,
}

fn run_chunks(opts: &ParserOptions, chunks: &[&str]) -> (Vec<Event>, Finish) {
    let mut p = OutputParser::new(opts.clone()).expect("valid options");
    let mut events = Vec::new();
    for c in chunks {
        events.extend(p.push(c));
    }
    let fin = p.finish();
    (events, fin)
}

fn summarize(events: &[Event], fin: &Finish) -> Summary {
    let mut s = Summary {
        reasoning: String::new(),
        content: String::new(),
        calls: Vec::new(),
        finish_tail: Finish {
            events: Vec::new(),
            ..fin.clone()
        },
    };
    for e in events.iter().chain(fin.events.iter()) {
        match e {
            Event::Reasoning(t) => s.reasoning.push_str(t),
            Event::Content(t) => s.content.push_str(t),
            Event::ToolCall(c) => s.calls.push(c.clone()),
        }
    }
    s
}

fn one_push(opts: &ParserOptions, input: &str) -> Summary {
    let (ev, fin) = run_chunks(opts, &[input]);
    summarize(&ev, &fin)
}

/// Cuts `input` at the given fractions, moved down to char boundaries.
fn split_at_fracs<'a>(input: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| {
            let mut i = c % (input.len() + 1);
            while !input.is_char_boundary(i) {
                i -= 1;
            }
            i
        })
        .collect();
    points.push(0);
    points.push(input.len());
    points.sort_unstable();
    points.windows(2).map(|w| &input[w[0]..w[1]]).collect()
}

const FULL: &str = "<think>\nstep by step reasoning...\n</think>\nThe answer text.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n<invoke name=\"other_tool\">\n</invoke>\n</minimax:tool_call>";

const UNICODE: &str = "<think>pensée 世界 🚀</think>héllo 世界 🚀<minimax:tool_call><invoke name=\"say\"><parameter name=\"text\">\nhéllo 世界 🚀\n</parameter></invoke></minimax:tool_call>";

const LITERAL_CLOSE: &str = "<minimax:tool_call>\n<invoke name=\"write\">\n<parameter name=\"body\">a</parameter> b </parameter>x</parameter>\n<parameter name=\"n\">1</parameter>\n</invoke>\n</minimax:tool_call>";

const AFTER_BLOCK: &str = "<think>r</think>before<minimax:tool_call>\n<invoke name=\"a\">\n</invoke>\n</minimax:tool_call>\n\nafter <b>bold</b>";

const TRUNCATED: &str = "<think>plan</think>Calling.<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">3";

const MALFORMED: &str = "ok<minimax:tool_call>\n<invoke name=\"a\"></invoke>\n<invoke>\n<parameter name=\"x\">1</parameter>\n</invoke>\n</minimax:tool_call>tail";

fn inputs() -> Vec<(&'static str, ParserOptions)> {
    let start_in = ParserOptions {
        starts_in_reasoning: true,
        ..ParserOptions::default()
    };
    let no_reasoning = ParserOptions {
        reasoning_enabled: false,
        ..ParserOptions::default()
    };
    vec![
        (FULL, ParserOptions::default()),
        (UNICODE, ParserOptions::default()),
        (LITERAL_CLOSE, ParserOptions::default()),
        (AFTER_BLOCK, ParserOptions::default()),
        (TRUNCATED, ParserOptions::default()),
        (MALFORMED, ParserOptions::default()),
        ("inside</think>answer<think>more</think>end", start_in),
        (
            "<think>x</think>y<minimax:tool_call><invoke name='q'></invoke></minimax:tool_call>",
            no_reasoning,
        ),
        ("<thin<minim<", ParserOptions::default()),
    ]
}

fn call(index: usize, name: &str, args: Value) -> ToolCall {
    let Value::Object(arguments) = args else {
        panic!("args must be an object")
    };
    ToolCall {
        index,
        name: name.into(),
        arguments,
    }
}

#[test]
fn full_example_one_push() {
    let (events, fin) = run_chunks(&ParserOptions::default(), &[FULL]);
    assert_eq!(
        events,
        vec![
            Event::Reasoning("step by step reasoning...\n".into()),
            Event::Content("The answer text.\n".into()),
            Event::ToolCall(call(0, "get_weather", json!({"city": "Paris", "days": 3}))),
            Event::ToolCall(call(1, "other_tool", json!({}))),
        ]
    );
    assert_eq!(fin, Finish::default());
}

#[test]
fn arguments_json_is_compact_openai_string() {
    let c = call(0, "get_weather", json!({"city": "Paris", "days": 3}));
    assert_eq!(c.arguments_json(), r#"{"city":"Paris","days":3}"#);
    assert_eq!(call(1, "z", json!({})).arguments_json(), "{}");
}

#[test]
fn full_example_char_by_char() {
    let chunks: Vec<String> = FULL.chars().map(String::from).collect();
    let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let (events, fin) = run_chunks(&ParserOptions::default(), &refs);
    assert_eq!(
        summarize(&events, &fin),
        one_push(&ParserOptions::default(), FULL)
    );
    // Char-by-char feeding must still emit the first call before the stream ends.
    assert!(matches!(events.last(), Some(Event::ToolCall(c)) if c.name == "other_tool"));
}

#[test]
fn unicode_values_and_text() {
    let s = one_push(&ParserOptions::default(), UNICODE);
    assert_eq!(s.reasoning, "pensée 世界 🚀");
    assert_eq!(s.content, "héllo 世界 🚀");
    assert_eq!(
        s.calls,
        vec![call(0, "say", json!({"text": "héllo 世界 🚀"}))]
    );
}

#[test]
fn parameter_close_tag_inside_value() {
    let s = one_push(&ParserOptions::default(), LITERAL_CLOSE);
    assert_eq!(
        s.calls,
        vec![call(
            0,
            "write",
            json!({"body": "a</parameter> b </parameter>x", "n": 1})
        )]
    );
    assert_eq!(s.content, "");
}

#[test]
fn pending_parameter_close_is_held_then_decided() {
    let mut p = OutputParser::new(ParserOptions::default()).unwrap();
    assert!(p
        .push("<minimax:tool_call><invoke name=\"f\"><parameter name=\"v\">x</parameter>  ")
        .is_empty());
    // The closer turns out to be literal text.
    assert!(p.push("y</parameter>\n").is_empty());
    let ev = p.push("</invoke></minimax:tool_call>");
    assert_eq!(
        ev,
        vec![Event::ToolCall(call(
            0,
            "f",
            json!({"v": "x</parameter>  y"})
        ))]
    );
}

#[test]
fn pending_parameter_close_at_finish_closes_value() {
    let (ev, fin) = run_chunks(
        &ParserOptions::default(),
        &["<minimax:tool_call><invoke name=\"f\"><parameter name=\"v\">x</parameter>\n"],
    );
    assert!(ev.is_empty());
    assert!(fin.unterminated_tool_block);
    let t = fin.truncated_tool_call.expect("truncated call");
    assert_eq!(t.name.as_deref(), Some("f"));
    assert_eq!(Value::Object(t.arguments), json!({"v": "x"}));
    assert_eq!(t.unfinished_parameter, None);
}

#[test]
fn text_after_block_is_content() {
    let s = one_push(&ParserOptions::default(), AFTER_BLOCK);
    assert_eq!(s.reasoning, "r");
    assert_eq!(s.content, "beforeafter <b>bold</b>");
    assert_eq!(s.calls, vec![call(0, "a", json!({}))]);
}

#[test]
fn stream_cut_mid_call() {
    let s = one_push(&ParserOptions::default(), TRUNCATED);
    assert_eq!(s.reasoning, "plan");
    assert_eq!(s.content, "Calling.");
    assert!(s.calls.is_empty());
    assert!(s.finish_tail.unterminated_tool_block);
    let t = s
        .finish_tail
        .truncated_tool_call
        .expect("truncated call reported");
    assert_eq!(t.index, 0);
    assert_eq!(t.name.as_deref(), Some("get_weather"));
    assert_eq!(t.arguments_json(), r#"{"city":"Paris"}"#);
    assert_eq!(t.unfinished_parameter, Some(("days".into(), "3".into())));
}

#[test]
fn stream_cut_in_invoke_tag_and_between_calls() {
    let s = one_push(
        &ParserOptions::default(),
        "a<minimax:tool_call><invoke name=\"x\"></invoke><invoke name=\"get_wea",
    );
    assert_eq!(s.content, "a");
    assert_eq!(s.calls, vec![call(0, "x", json!({}))]);
    let t = s
        .finish_tail
        .truncated_tool_call
        .expect("open invoke reported");
    assert_eq!((t.index, t.name), (1, None));

    let s = one_push(&ParserOptions::default(), "a<minimax:tool_call>\n<inv");
    assert_eq!(s.content, "a");
    assert!(s.finish_tail.unterminated_tool_block);
    assert_eq!(s.finish_tail.truncated_tool_call, None);
}

#[test]
fn malformed_block_becomes_content() {
    let s = one_push(&ParserOptions::default(), MALFORMED);
    // The well-formed call before the defect is kept.
    assert_eq!(s.calls, vec![call(0, "a", json!({}))]);
    assert_eq!(
        s.content,
        "ok\n<invoke>\n<parameter name=\"x\">1</parameter>\n</invoke>\n</minimax:tool_call>tail"
    );
    assert!(!s.finish_tail.unterminated_tool_block);

    // Defect before any call: the whole raw block (start tag included) is shown.
    let s = one_push(
        &ParserOptions::default(),
        "<minimax:tool_call>stray text</minimax:tool_call>",
    );
    assert_eq!(
        s.content,
        "<minimax:tool_call>stray text</minimax:tool_call>"
    );
    assert!(s.calls.is_empty());

    for bad in [
        "<minimax:tool_call><invoke name=\"\"></invoke></minimax:tool_call>",
        "<minimax:tool_call><invoke name=\"a\nb\"></invoke></minimax:tool_call>",
        "<minimax:tool_call><invoke name=\"a\" x></invoke></minimax:tool_call>",
        "<minimax:tool_call><invoke name=\"a\">junk</invoke></minimax:tool_call>",
        "<minimax:tool_call><invoke name=\"a\"><parameter name=>v</parameter></invoke></minimax:tool_call>",
    ] {
        let s = one_push(&ParserOptions::default(), bad);
        assert!(s.calls.is_empty(), "{bad}");
        assert_eq!(s.content, bad, "raw text shown verbatim for {bad:?}");
    }
}

#[test]
fn name_attribute_forms() {
    let s = one_push(
        &ParserOptions::default(),
        "<minimax:tool_call><invoke name='a' ><parameter name=b>1</parameter></invoke><invoke name=c></invoke></minimax:tool_call>",
    );
    assert_eq!(
        s.calls,
        vec![call(0, "a", json!({"b": 1})), call(1, "c", json!({}))]
    );
}

#[test]
fn starts_in_reasoning_and_disabled_reasoning() {
    let opts = ParserOptions {
        starts_in_reasoning: true,
        ..ParserOptions::default()
    };
    let s = one_push(&opts, "\nthinking</think>\n\nanswer");
    assert_eq!(
        (s.reasoning.as_str(), s.content.as_str()),
        ("thinking", "answer")
    );

    let opts = ParserOptions {
        reasoning_enabled: false,
        starts_in_reasoning: true,
        ..ParserOptions::default()
    };
    let s = one_push(&opts, "<think>x</think>y");
    assert_eq!(
        (s.reasoning.as_str(), s.content.as_str()),
        ("", "<think>x</think>y")
    );
}

#[test]
fn tool_markup_inside_reasoning_is_reasoning() {
    let s = one_push(
        &ParserOptions::default(),
        "<think>maybe <minimax:tool_call><invoke name=\"f\"></invoke></think>no",
    );
    assert_eq!(
        s.reasoning,
        "maybe <minimax:tool_call><invoke name=\"f\"></invoke>"
    );
    assert_eq!(s.content, "no");
    assert!(s.calls.is_empty());
}

#[test]
fn partial_tag_held_back_then_flushed_at_finish() {
    let mut p = OutputParser::new(ParserOptions::default()).unwrap();
    assert_eq!(p.push("Hi <thi"), vec![Event::Content("Hi ".into())]);
    assert_eq!(p.push("s"), vec![Event::Content("<this".into())]);
    assert_eq!(p.push(" <minimax:tool"), vec![Event::Content(" ".into())]);
    let fin = p.finish();
    assert_eq!(fin.events, vec![Event::Content("<minimax:tool".into())]);
    assert!(!fin.unterminated_tool_block);
}

#[test]
fn schema_typing() {
    let mut schemas = ToolSchemas::new();
    schemas.insert("f", "zip", "string");
    schemas.insert("f", "count", "integer");
    schemas.insert("f", "bad", "integer");
    schemas.insert("f", "flags", "array");
    let opts = ParserOptions {
        tool_schemas: schemas,
        ..ParserOptions::default()
    };
    let input = "<minimax:tool_call><invoke name=\"f\">\n<parameter name=\"zip\">\n75001\n</parameter>\n<parameter name=\"count\"> 7 </parameter>\n<parameter name=\"bad\">seven</parameter>\n<parameter name=\"flags\">[true]</parameter>\n<parameter name=\"free\">2.5</parameter>\n</invoke></minimax:tool_call>";
    let s = one_push(&opts, input);
    assert_eq!(
        s.calls,
        vec![call(
            0,
            "f",
            json!({"zip": "75001", "count": 7, "bad": "seven", "flags": [true], "free": 2.5})
        )]
    );
    // Without the schema the zip code would have become a number.
    let s = one_push(&ParserOptions::default(), input);
    assert_eq!(s.calls[0].arguments["zip"], json!(75001));
}

#[test]
fn tags_override() {
    let tags = Tags {
        think_start: "[THINK]".into(),
        think_end: "[/THINK]".into(),
        tool_call_start: "[CALLS]".into(),
        tool_call_end: "[/CALLS]".into(),
        invoke_start: "[FN ".into(),
        invoke_end: "[/FN]".into(),
        parameter_start: "[ARG ".into(),
        parameter_end: "[/ARG]".into(),
    };
    let opts = ParserOptions {
        tags,
        ..ParserOptions::default()
    };
    let input =
        "[THINK]r[/THINK]c <think>x</think>[CALLS][FN \"f\">[ARG \"a\">1[/ARG][/FN][/CALLS]";
    let s = one_push(&opts, input);
    assert_eq!(s.reasoning, "r");
    assert_eq!(s.content, "c <think>x</think>");
    assert_eq!(s.calls, vec![call(0, "f", json!({"a": 1}))]);
    let chunks: Vec<String> = input.chars().map(String::from).collect();
    let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let (ev, fin) = run_chunks(&opts, &refs);
    assert_eq!(summarize(&ev, &fin), s);
}

#[test]
fn empty_tag_is_rejected() {
    let mut tags = Tags::default();
    tags.invoke_end.clear();
    let err = OutputParser::new(ParserOptions {
        tags,
        ..ParserOptions::default()
    })
    .unwrap_err();
    assert_eq!(err.to_string(), "tag `invoke_end` must not be empty");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any chunking gives the same reasoning, content, calls and finish state
    /// as one push, and no event ever carries tag text of the valid inputs.
    #[test]
    fn chunking_invariance(which in 0usize..9, cuts in prop::collection::vec(any::<usize>(), 0..24)) {
        let all = inputs();
        let (input, opts) = &all[which % all.len()];
        let chunks = split_at_fracs(input, &cuts);
        let (events, fin) = run_chunks(opts, &chunks);
        prop_assert_eq!(summarize(&events, &fin), one_push(opts, input));
        if [FULL, UNICODE, LITERAL_CLOSE, TRUNCATED].contains(input) {
            for e in events.iter().chain(fin.events.iter()) {
                if let Event::Content(t) | Event::Reasoning(t) = e {
                    prop_assert!(!t.contains('<') && !t.contains('>'), "markup leaked: {:?}", t);
                }
            }
        }
    }

    /// Reasoning and content never mix: reasoning uses Greek letters only,
    /// content Latin letters only, so any mixing within one event is visible.
    #[test]
    fn reasoning_never_in_content(
        reasoning in "[αβγδ ]{0,20}",
        content in "[abcd ]{0,20}",
        starts_in in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..16),
    ) {
        let input = if starts_in {
            format!("{reasoning}</think>{content}<think>{reasoning}</think>{content}")
        } else {
            format!("{content}<think>{reasoning}</think>{content}")
        };
        let opts = ParserOptions { starts_in_reasoning: starts_in, ..ParserOptions::default() };
        let (events, fin) = run_chunks(&opts, &split_at_fracs(&input, &cuts));
        for e in events.iter().chain(fin.events.iter()) {
            match e {
                Event::Content(t) => prop_assert!(t.chars().all(|c| "abcd ".contains(c)), "content {:?}", t),
                Event::Reasoning(t) => prop_assert!(t.chars().all(|c| "αβγδ ".contains(c)), "reasoning {:?}", t),
                Event::ToolCall(_) => prop_assert!(false, "no calls expected"),
            }
        }
    }

    /// Arbitrary soups of tag fragments and text never panic and still
    /// parse the same under every chunking.
    #[test]
    fn fuzz_soup_chunking_invariance(
        parts in prop::collection::vec(prop::sample::select(vec![
            "<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>",
            "<invoke name=\"f\">", "<invoke name=", "\"g\">", "</invoke>",
            "<parameter name=\"p\">", "</parameter>", "<", ">", "\n", " ", "x", "7", "é🚀", "\"",
        ]), 0..40),
        starts_in in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..16),
    ) {
        let input: String = parts.concat();
        let opts = ParserOptions { starts_in_reasoning: starts_in, ..ParserOptions::default() };
        let (events, fin) = run_chunks(&opts, &split_at_fracs(&input, &cuts));
        prop_assert_eq!(summarize(&events, &fin), one_push(&opts, &input));
    }
}

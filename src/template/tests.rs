//! Unit tests of the template module: provenance (which characters are markup and which are
//! content), limits, error messages and lines, and the built-in templates. The language itself
//! is checked against Python jinja2 by `tests/template_language.rs`.

use super::*;
use crate::format::json;
use crate::test_util::Must;

fn msgs(text: &str) -> Json {
    json::parse(text.as_bytes()).must()
}

fn render_with(src: &str, messages: &str, vars: &[(&str, &str)]) -> Result<Vec<Piece>> {
    let specials = vec![("bos_token".to_string(), "<s>".to_string()), ("eos_token".to_string(), "</s>".to_string())];
    let t = ChatTemplate::parse("t", src, specials)?;
    let vars = vars.iter().map(|(k, v)| (k.to_string(), msgs(v))).collect();
    let clock = Clock::Fixed(DateTime::new(2024, 7, 26, 12, 0, 0).must());
    t.render(&msgs(messages), &RenderOptions { add_generation_prompt: true, vars, clock })
}

fn pieces(src: &str, messages: &str) -> Vec<Piece> {
    render_with(src, messages, &[]).must()
}

fn m(s: &str) -> Piece {
    Piece::Markup(s.into())
}

fn c(s: &str) -> Piece {
    Piece::Content(s.into())
}

const ONE: &str = r#"[{"role": "user", "content": "Hi <|im_end|> x", "n": 7, "tags": ["a", "b"]}]"#;

#[test]
fn message_text_is_content_and_template_text_is_markup() {
    let p = pieces("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}", ONE);
    assert_eq!(p, [m("<s><|im_start|>"), c("user"), m("\n"), c("Hi <|im_end|> x"), m("<|im_end|>")]);
}

#[test]
fn concatenation_slicing_and_string_methods_keep_origins() {
    let p = pieces("{{ '<a>' + messages[0].content[:2] + '<b>' ~ messages[0].content.split(' ')[1] | upper }}", ONE);
    assert_eq!(p, [m("<a>"), c("Hi"), m("<b>"), c("<|IM_END|>")]);
    let p = pieces("{{ ('  ' ~ messages[0].content ~ '  ')|trim }}|{{ messages[0].content.strip('Hix ') }}", ONE);
    assert_eq!(p, [c("Hi <|im_end|> x"), m("|"), c("<|im_end|>")]);
    // Replaced text takes the replacement's origin; the rest keeps its own.
    let p = pieces("{{ messages[0].content.replace('<|im_end|>', '[end]') }}", ONE);
    assert_eq!(p, [c("Hi "), m("[end]"), c(" x")]);
    let p = pieces("{{ 'a-b'.replace('-', messages[0].role) }}", ONE);
    assert_eq!(p, [m("a"), c("user"), m("b")]);
    let p = pieces("{% for ch in messages[0].role %}{{ ch }}.{% endfor %}", ONE);
    assert_eq!(p, [c("u"), m("."), c("s"), m("."), c("e"), m("."), c("r"), m(".")]);
}

#[test]
fn serialized_data_is_content() {
    let p = pieces("{{ messages[0].tags|tojson }}|{{ messages[0].tags|string }}|{{ messages[0].n }}|{{ loop_free }}", ONE);
    assert_eq!(p, [c(r#"["a", "b"]"#), m("|"), c("['a', 'b']"), m("|"), c("7"), m("|")]);
    // A template-built structure around data: the structure is markup, the data content.
    let p = pieces("{{ {'role': messages[0].role}|tojson }}", ONE);
    assert_eq!(p, [m(r#"{"role": ""#), c("user"), m(r#""}"#)]);
    let p = pieces(r#"{{ {'t': "a\"b"}|tojson }}{{ {'t': messages[0].content}|tojson }}"#, r#"[{"content": "q\"<|x|>"}]"#);
    assert_eq!(p, [m(r#"{"t": "a\"b"}{"t": ""#), c(r#"q\"<|x|>"#), m(r#""}"#)]);
    let p = pieces("{{ '%s!' % messages[0].role }}{{ [messages[0].role]|join(', ') }}", ONE);
    assert_eq!(p, [c("user"), m("!"), c("user")]);
}

#[test]
fn computed_values_are_markup_and_data_derived_numbers_content() {
    let p = pieces("{% for m in messages %}{{ loop.index }}:{{ m.n + 1 }}:{{ messages|length }}:{{ 3 * 2 }}{% endfor %}{{ strftime_now('%Y') }}", ONE);
    assert_eq!(p, [m("1:"), c("8"), m(":"), c("1"), m(":62024")]);
}

#[test]
fn extra_variables_are_content_and_special_tokens_markup() {
    let p = render_with("{{ eos_token }}{{ date }}{{ bos_token }}", "[]", &[("date", r#""26 Jul <s>""#)]).must();
    assert_eq!(p, [m("</s>"), c("26 Jul <s>"), m("<s>")]);
    // An extra variable overrides a special token of the same name, and is then content.
    let p = render_with("{{ bos_token }}", "[]", &[("bos_token", r#""<fake>""#)]).must();
    assert_eq!(p, [c("<fake>")]);
}

#[test]
fn captured_output_keeps_origins() {
    let src = "{% macro show(x) %}[{{ x }}]{% endmacro %}{{ show(messages[0].role) }}{% set cap %}<{{ messages[0].role }}>{% endset %}{{ cap|trim }}";
    assert_eq!(pieces(src, ONE), [m("["), c("user"), m("]<"), c("user"), m(">")]);
    let p = pieces("{{ messages[0].content|indent(2, true) }}", r#"[{"content": "a\nb"}]"#);
    assert_eq!(p, [m("  "), c("a"), m("\n  "), c("b")]);
}

#[test]
fn jinja_looking_data_is_never_evaluated() {
    let p = pieces("{{ messages[0].content }}", r#"[{"content": "{{ bos_token }}{% if true %}x{% endif %}"}]"#);
    assert_eq!(p, [c("{{ bos_token }}{% if true %}x{% endif %}")]);
}

#[test]
fn reasoning_is_aliased_as_transformers_does() {
    let p = pieces("{% for m in messages %}{{ m|tojson }}{% endfor %}", r#"[{"role": "assistant", "reasoning": "r", "content": "x"}]"#);
    assert_eq!(pieces_text(&p), r#"{"thinking": "r", "role": "assistant", "reasoning": "r", "content": "x", "reasoning_content": "r"}"#);
}

#[test]
fn errors_name_the_template_and_line() {
    let e = render_with("line one\n{{ x.y }}\n{{ messages[0].nope.z }}", ONE, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Template);
    assert_eq!(e.message(), "t: line 2: 'x' is undefined");
    let e = render_with("a\n\n{% for %}", "[]", &[]).unwrap_err();
    assert!(e.message().starts_with("t: line 3: "), "{e}");
    let e = render_with("{{ 1 }}\n{{ 'a' + none }}", "[]", &[]).unwrap_err();
    assert_eq!(e.message(), "t: line 2: can only concatenate str (not \"NoneType\") to str");
    let e = render_with("x\n{{ raise_exception('Only user and assistant roles are supported!') }}", "[]", &[]).unwrap_err();
    assert_eq!(e.message(), "Only user and assistant roles are supported!");
    assert_eq!(e.to_string(), "template error: Only user and assistant roles are supported!");
    assert_eq!(render_with("x", r#"{"role": "user"}"#, &[]).unwrap_err().kind(), ErrorKind::Arg);
    assert_eq!(render_with("x", "[]", &[("messages", "[]")]).unwrap_err().kind(), ErrorKind::Arg);
}

fn small_limits() -> eval::Limits {
    eval::Limits { max_output: 1 << 20, max_steps: 2_000_000, max_calls: 120 }
}

fn render_limited(src: &str) -> Error {
    let t = ChatTemplate::parse("t", src, Vec::new()).must();
    let opts = RenderOptions::default();
    match t.render_with_limits(&msgs("[]"), &opts, small_limits()) {
        Ok(p) => panic!("{src}: rendered {} bytes", pieces_text(&p).len()),
        Err(e) => e,
    }
}

#[test]
fn limits_stop_hostile_templates() {
    let e = render_limited("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    assert!(e.message().contains("macro calls nested more than 120"), "{e}");
    let e = render_limited("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
    assert!(e.message().contains("steps"), "{e}");
    let e = render_limited("{{ 'x' * 100000000 }}");
    assert!(e.message().contains("bytes"), "{e}");
    let e = render_limited("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
    assert!(e.message().contains("output would exceed"), "{e}");
    let e = render_limited("{% set s = 'x' * 100000 %}{% for i in range(100000) %}{% set t = s ~ s %}{% endfor %}");
    assert!(e.message().contains("steps"), "{e}");
    let e = render_limited("{% set ns = namespace(v=[]) %}{% for i in range(1000) %}{% set ns.v = [ns.v] %}{% endfor %}");
    assert!(e.message().contains("nested more than"), "{e}");
    let e = render_limited("{% for n in [[1]] recursive %}{{ loop(n) }}{% endfor %}");
    assert!(e.message().contains("nested") || e.message().contains("iterable"), "{e}");
    let e = render_limited("{% set ns = namespace(c=0) %}{% for i in range(100000) %}{% for j in range(100000) %}{% set ns.c = ns.c + 1 %}{% endfor %}{% endfor %}");
    assert!(e.message().contains("steps"), "{e}");
}

#[test]
fn recursion_at_the_limit_fits_the_stack() {
    // 120 nested macro calls, each through statements and expressions, on a test thread's
    // default stack.
    let src = "{% macro f(n) %}{% if n > 0 %}{% for i in [1] %}{{ (f(n - 1) ~ '')|trim }}{% endfor %}{% else %}bottom{% endif %}{% endmacro %}{{ f(118) }}";
    let t = ChatTemplate::parse("t", src, Vec::new()).must();
    assert_eq!(t.render_text(&msgs("[]"), &RenderOptions::default()).must(), "bottom");
}

#[test]
fn a_namespace_that_holds_itself_prints_and_is_freed() {
    let p = pieces("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}", "[]");
    assert_eq!(pieces_text(&p), "<Namespace {'a': 1, 'me': <Namespace {...}>}>");
    let e = render_with("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns|tojson }}", "[]", &[]).unwrap_err();
    assert!(e.message().contains("not JSON serializable"), "{e}");
}

#[test]
fn builtins_render_their_formats() {
    let conv = msgs(r#"[{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": " U "}, {"type": "image"}]},
        {"role": "assistant", "content": null}]"#);
    let gen = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    let chatml = ChatTemplate::builtin("chatml").must();
    assert_eq!(chatml.render_text(&conv, &gen).must(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n U <|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(chatml.end_of_turn(), Some("<|im_end|>"));
    let llama3 = ChatTemplate::builtin("llama3").must();
    assert_eq!(llama3.render_text(&conv, &RenderOptions::default()).must(),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>\
<|start_header_id|>assistant<|end_header_id|>\n\n<|eot_id|>");
    assert_eq!(llama3.end_of_turn(), Some("<|eot_id|>"));
    let p = llama3.render(&msgs(r#"[{"role": "user", "content": "<|eot_id|>"}]"#), &gen).must();
    assert_eq!(p[1], c("user"));
    assert_eq!(p[3], c("<|eot_id|>"));
    assert_eq!(ChatTemplate::builtin("vicuna").unwrap_err().kind(), ErrorKind::Arg);
}

#[test]
fn huge_values_are_refused_before_they_are_built() {
    for src in [
        "{% set s = 'x' * 1000000 %}{{ [s] * 1000 }}",
        "{% set s = 'x' * 1000000 %}{{ ([s] * 1000)|string|length }}",
        "{% set s = 'x' * 1000000 %}{{ ([s] * 1000)|tojson|length }}",
        "{% set s = 'x' * 1000000 %}{{ ([s] * 1000)|join|length }}",
        "{{ '%999999999s' % 'x' }}",
        "{{ [1]|batch(1000000000000, 0)|list }}",
        "{% set s = 'x' * 1000000 %}{% for i in range(10000) %}{% set t = ([s] * 10)|string %}{% endfor %}",
    ] {
        let e = render_limited(src);
        assert!(["bytes", "steps", "not supported", "items"].iter().any(|w| e.message().contains(w)), "{src}: {e}");
    }
}

const FUZZ_ROUNDS: usize = 20_000;

/// Random templates from fragments of the language never panic: they render or fail with an
/// error, under small limits.
#[test]
fn random_templates_never_panic() {
    const FRAGS: &[&str] = &["{{", "}}", "{%", "%}", "{%-", "-%}", "{{-", "-}}", "{#", "#}", " if ", " elif ", " else ", " endif ",
        " for ", " in ", " endfor ", " set ", " endset ", " macro ", " endmacro ", " call ", " endcall ", " filter ", " endfilter ",
        " raw ", " endraw ", " break ", " continue ", " with ", " endwith ", " generation ", " endgeneration ", "x", "y", "ns",
        "messages", "loop", ".", "index", "[", "]", "(", ")", "{", "}", ",", ":", "=", "==", "!=", "<", ">", "+", "-", "*", "/",
        "//", "%", "**", "~", "|", " is ", " not ", " and ", " or ", "defined", "none", "true", "'a'", "\"b\\n\"", "0", "1", "-1",
        "2.5", "1e3", "range(3)", "range(-3, 3, 2)", "upper", "tojson", "join", "length", "map", "select", "items", "string",
        "namespace(v=1)", "dict(a=1)", "raise_exception('no')", "strftime_now('%Y')", "m()", "caller()", "loop(x)", "split(',')",
        "strip()", "replace('a','b')", "[1, 2]", "{'k': 'v'}", "x[1:]", "x[::-1]", "\n", "  ", "\t", "é", "👋", "<|im_end|>",
        "'%s' % x", "x if y else 'z'", "lipsum()", "cycler(1, 2)", "joiner()", "recursive"];
    let mut seed = 7u64;
    let mut next = move |n: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let messages = msgs(r#"[{"role": "user", "content": "a,b"}, {"role": "assistant", "content": [1, {"x": null}]}]"#);
    let limits = eval::Limits { max_output: 1 << 16, max_steps: 50_000, max_calls: 40 };
    let (mut parsed, mut rendered) = (0, 0);
    for _ in 0..FUZZ_ROUNDS {
        let len = 1 + next(40) as usize;
        let src: String = (0..len).map(|_| FRAGS[next(FRAGS.len() as u64) as usize]).collect();
        let Ok(t) = ChatTemplate::parse("fuzz", &src, Vec::new()) else { continue };
        parsed += 1;
        let vars = vec![("x".to_string(), msgs(r#"["p", "q"]"#)), ("y".to_string(), msgs("3"))];
        if t.render_with_limits(&messages, &RenderOptions { vars, ..RenderOptions::default() }, limits).is_ok() {
            rendered += 1;
        }
    }
    // The generator must reach the evaluator, or this checks only the parser.
    assert!(parsed > 1000 && rendered > 500, "parsed {parsed}, rendered {rendered}");
}

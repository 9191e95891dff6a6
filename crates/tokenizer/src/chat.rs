//! Chat templates (`tokenizer.chat_template`, Jinja) rendered with minijinja, with the
//! Python-isms real templates use (string methods via minijinja-contrib's pycompat,
//! `raise_exception`, `strftime_now`, `tojson` with Python's options, `from_json`, loop
//! controls, namespaces). Templates come from untrusted files, so the environment has no
//! loader (no file access), exposes no environment variables, and limits recursion depth,
//! executed instructions (loop iterations) and output size.

use std::fmt::Write as _;
use std::io;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

/// llama.cpp's fallback when a model has no template (common/chat.cpp, "chatml").
pub const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}";

/// One message of a conversation.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// Tool calls made by an assistant message (OpenAI shape), if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tool_calls: Option<serde_json::Value>,
    /// For `tool` messages: the call this answers.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub name: Option<String>,
    /// An assistant turn's reasoning, for templates that render it back (`<think>`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }
}

/// Why a template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    #[error("chat template output exceeds {0} bytes")]
    OutputTooLarge(usize),
    #[error("chat template exceeded its instruction budget (a loop that runs too long?)")]
    OutOfFuel,
    #[error("chat template failed: {0}")]
    Render(String),
}

/// Resource limits for rendering one untrusted template.
#[derive(Clone, Copy, Debug)]
pub struct TemplateLimits {
    /// Most bytes of output.
    pub max_output: usize,
    /// minijinja "fuel": roughly, instructions executed (bounds loop iterations).
    pub fuel: u64,
    /// Deepest nesting of macro calls / includes.
    pub max_recursion: usize,
}

impl Default for TemplateLimits {
    fn default() -> TemplateLimits {
        TemplateLimits {
            max_output: 4 << 20,
            fuel: 20_000_000,
            max_recursion: 100,
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    limits: TemplateLimits,
    /// False when the template rejects or drops system messages; those are then folded into
    /// the first user message (llama.cpp's minja "polyfill").
    supports_system_role: bool,
    /// Strip a leading BOS / trailing EOS text from the output (set when the model's tokenizer
    /// adds them itself, as llama.cpp's `common_chat_templates_apply` does).
    strip_bos: bool,
    /// The Jinja source as given (tool-call formats are recognised from it).
    source: String,
    strip_eos: bool,
}

/// The source llama.cpp would render: "chatml" or empty means ChatML, plus llama.cpp's two
/// patches for templates its engine cannot run as written (gpt-oss, Mistral tool calls).
fn patch_source(source: &str) -> String {
    if source.is_empty() || source == "chatml" {
        return CHATML_TEMPLATE.to_string();
    }
    let mut s = source.to_string();
    if s.contains("<|channel|>") && s.contains("in message.content or") {
        s = s.replace(
            "{%- if \"<|channel|>analysis<|message|>\" in message.content or \"<|channel|>final<|message|>\" in message.content %}",
            "{%- if false %}",
        );
    }
    if s.contains("[TOOL_CALLS]") && s.contains("if (message['content'] is none or") {
        s = s.replace(
            "{%- if (message['content'] is none or message['content'] == '' or message['content']|length == 0) and (message['tool_calls'] is not defined or message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
            "{%- if false %}",
        );
    }
    s
}

/// `length`, with undefined counting as empty (as in Jinja2 and llama.cpp's engine).
fn length(v: Value) -> Result<Value, Error> {
    if v.is_undefined() {
        return Ok(Value::from(0));
    }
    v.len().map(Value::from).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("cannot calculate length of value of type {}", v.kind()),
        )
    })
}

/// Rewrites HF's `{% generation %}` / `{% endgeneration %}` (assistant-mask markers that
/// render their body unchanged) into an always-true `if`, keeping whitespace control.
fn strip_generation_tags(source: &str) -> String {
    // Compiled once: building it cost more than parsing a typical template.
    static RE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\{%(-?)\s*(end)?generation\s*(-?)%\}").expect("valid regex")
    });
    RE.replace_all(source, |c: &regex::Captures| {
        let body = if c.get(2).is_some() {
            "endif"
        } else {
            "if true"
        };
        format!("{{%{} {body} {}%}}", &c[1], &c[3])
    })
    .into_owned()
}

/// The function that [`guard_namespace_sets`] wraps around every namespace assignment.
const ACYCLIC_FN: &str = "__lamina_acyclic";

/// Rewrites each `{% set NS.ATTR = EXPR %}` into `{% set NS.ATTR = __lamina_acyclic(NS,
/// (EXPR)) %}`, keeping the tag's whitespace control. Namespaces are minijinja's only mutable
/// values, so this is the only way a template can build a cycle (`{% set ns.x = [ns] %}`);
/// printing, concatenating or comparing a cyclic value recurses until the stack overflows,
/// which aborts the process. [`acyclic`] refuses the assignment instead. Comments, `{{ }}`
/// and `{% raw %}` blocks are skipped; string literals are stepped over.
fn guard_namespace_sets(src: &str) -> String {
    let b = src.as_bytes();
    // The end of the string literal starting at `i` (its closing quote + 1).
    let string_end = |i: usize| {
        let q = b[i];
        let mut k = i + 1;
        while k < b.len() && b[k] != q {
            k += if b[k] == b'\\' { 2 } else { 1 };
        }
        (k + 1).min(b.len())
    };
    // The index of `close` at or after `i` outside string literals (or the end).
    let find_close = |mut i: usize, close: &[u8]| {
        while i < b.len() && !b[i..].starts_with(close) {
            i = if b[i] == b'"' || b[i] == b'\'' {
                string_end(i)
            } else {
                i + 1
            };
        }
        i.min(b.len())
    };
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let ident = |i: usize| {
        let mut k = i;
        while k < b.len() && is_ident(b[k]) {
            k += 1;
        }
        (k > i && !b[i].is_ascii_digit()).then_some(k)
    };
    let mut out = String::with_capacity(src.len());
    let (mut i, mut last) = (0, 0);
    while i + 1 < b.len() {
        if b[i..].starts_with(b"{#") {
            i = find_close(i + 2, b"#}") + 2;
            continue;
        }
        if b[i..].starts_with(b"{{") {
            i = find_close(i + 2, b"}}") + 2;
            continue;
        }
        if !b[i..].starts_with(b"{%") {
            i += 1;
            continue;
        }
        let mut j = i + 2;
        if j < b.len() && (b[j] == b'-' || b[j] == b'+') {
            j += 1;
        }
        j = skip_ws(j);
        let word_end = ident(j).unwrap_or(j);
        let word = &src[j..word_end];
        let tag_end = find_close(word_end, b"%}");
        if word == "raw" {
            // Everything up to `{% endraw %}` is text.
            let mut k = tag_end;
            loop {
                k = match src[k.min(src.len())..].find("{%") {
                    Some(o) => k + o,
                    None => break i = b.len(),
                };
                let mut e = k + 2;
                if e < b.len() && (b[e] == b'-' || b[e] == b'+') {
                    e += 1;
                }
                e = skip_ws(e);
                if src[e..].starts_with("endraw") {
                    break i = find_close(e, b"%}") + 2;
                }
                k += 2;
            }
            continue;
        }
        i = tag_end + 2;
        if word != "set" {
            continue;
        }
        // `set NS . ATTR =` (not `==`), then the expression up to the tag's end.
        let ns_start = skip_ws(word_end);
        let Some(ns_end) = ident(ns_start) else {
            continue;
        };
        let dot = skip_ws(ns_end);
        if b.get(dot) != Some(&b'.') {
            continue;
        }
        let Some(attr_end) = ident(skip_ws(dot + 1)) else {
            continue;
        };
        let eq = skip_ws(attr_end);
        if b.get(eq) != Some(&b'=') || b.get(eq + 1) == Some(&b'=') || tag_end >= b.len() {
            continue;
        }
        let mut expr_end = tag_end;
        if b[expr_end - 1] == b'-' || b[expr_end - 1] == b'+' {
            expr_end -= 1;
        }
        out.push_str(&src[last..eq + 1]);
        out.push_str(&format!(
            " {ACYCLIC_FN}({}, ({})) ",
            &src[ns_start..ns_end],
            &src[eq + 1..expr_end]
        ));
        last = expr_end;
    }
    out.push_str(&src[last..]);
    out
}

/// `value`, unless it holds `target` (a namespace about to receive it: a cycle). Identity is
/// minijinja's equality (the same object, or an object of equal contents: the second refuses
/// an assignment that would have been harmless, which no real template makes). Values are
/// walked within a depth and a node budget: nothing cyclic can exist before this assignment.
fn acyclic(target: Value, value: Value) -> Result<Value, Error> {
    fn holds(v: &Value, target: &Value, depth: usize, budget: &mut usize) -> Result<bool, Error> {
        if depth > 256 || *budget == 0 {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "value assigned to a namespace is nested too deeply",
            ));
        }
        *budget -= 1;
        if v.as_object().is_none() {
            return Ok(false);
        }
        if v == target {
            return Ok(true);
        }
        match v.kind() {
            ValueKind::Seq => {
                for item in v.try_iter()? {
                    if holds(&item, target, depth + 1, budget)? {
                        return Ok(true);
                    }
                }
            }
            ValueKind::Map => {
                for key in v.try_iter()? {
                    if holds(&v.get_item(&key)?, target, depth + 1, budget)? {
                        return Ok(true);
                    }
                }
            }
            _ => {}
        }
        Ok(false)
    }
    if target.kind() != ValueKind::Map {
        // Not a namespace: the assignment itself fails with minijinja's own error.
        return Ok(value);
    }
    if holds(&value, &target, 0, &mut 200_000)? {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "cannot assign a value that holds the namespace to one of its attributes (a cycle)",
        ));
    }
    Ok(value)
}

/// Python's notion: strings, lists, maps are iterable; none and undefined are not.
fn is_iterable(v: Value) -> bool {
    !v.is_none() && !v.is_undefined() && v.try_iter().is_ok()
}

const NAME: &str = "chat_template";

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {msg}"),
    ))
}

/// Days since 1970-01-01 -> (year, month, day) (proleptic Gregorian; Howard Hinnant's method).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `strftime` for the directives templates use, at a given UNIX time (UTC).
pub fn strftime_at(fmt: &str, secs: i64) -> String {
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
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (rem / 3600, rem / 60 % 60, rem % 60);
    let wd = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{y}"),
            Some('y') => write!(out, "{:02}", y.rem_euclid(100)),
            Some('m') => write!(out, "{m:02}"),
            Some('d') => write!(out, "{d:02}"),
            Some('-') => match chars.next() {
                Some('d') => write!(out, "{d}"),
                Some('m') => write!(out, "{m}"),
                Some(o) => write!(out, "%-{o}"),
                None => write!(out, "%-"),
            },
            Some('H') => write!(out, "{hh:02}"),
            Some('M') => write!(out, "{mm:02}"),
            Some('S') => write!(out, "{ss:02}"),
            Some('B') => write!(out, "{month}"),
            Some('b') => write!(out, "{}", &month[..3]),
            Some('A') => write!(out, "{wd}"),
            Some('a') => write!(out, "{}", &wd[..3]),
            Some('%') => write!(out, "%"),
            Some(o) => write!(out, "%{o}"),
            None => write!(out, "%"),
        };
    }
    out
}

fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime_at(&fmt, secs)
}

/// Python `json.dumps` of a JSON value with the given options.
struct JsonStyle<'a> {
    indent: Option<&'a str>,
    item_sep: &'a str,
    key_sep: &'a str,
    sort_keys: bool,
    ensure_ascii: bool,
}

fn py_json(v: &serde_json::Value, st: &JsonStyle, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys,
        ensure_ascii,
    } = *st;
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                // Python prints floats with a decimal point (1.0, not 1).
                if f.fract() == 0.0 && f.abs() < 1e16 {
                    let _ = write!(out, "{f:.1}");
                } else {
                    let _ = write!(out, "{f}");
                }
            } else {
                let _ = write!(out, "{n}");
            }
        }
        J::String(s) => py_json_string(s, ensure_ascii, out),
        J::Array(a) => {
            if a.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                py_json(x, st, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(o) => {
            if o.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<_> = o.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                py_json_string(k, ensure_ascii, out);
                out.push_str(key_sep);
                py_json(x, st, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

fn py_json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7E) => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent_str = match &indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            None => Some(v.as_str().unwrap_or("").to_string()),
        },
    };
    let (mut item_sep, mut key_sep) = (
        if indent_str.is_some() {
            ",".to_string()
        } else {
            ", ".to_string()
        },
        ": ".to_string(),
    );
    if let Some(seps) = separators.filter(|s| !s.is_none() && !s.is_undefined()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        if let [a, b] = parts.as_slice() {
            item_sep = a.as_str().unwrap_or(",").to_string();
            key_sep = b.as_str().unwrap_or(":").to_string();
        }
    }
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    let style = JsonStyle {
        indent: indent_str.as_deref(),
        item_sep: &item_sep,
        key_sep: &key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    py_json(&json, &style, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn from_json(s: String) -> Result<Value, Error> {
    let v: serde_json::Value = serde_json::from_str(&s)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_serialize(&v))
}

/// Python methods pycompat lacks that templates use: `str.format` (positional `{}`).
fn unknown_method(
    state: &minijinja::State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if method == "format"
        && let Some(s) = value.as_str()
    {
        let mut out = String::new();
        let mut it = args.iter();
        let mut rest = s;
        while let Some(p) = rest.find("{}") {
            out.push_str(&rest[..p]);
            if let Some(a) = it.next() {
                out.push_str(&a.to_string());
            }
            rest = &rest[p + 2..];
        }
        out.push_str(rest);
        return Ok(Value::from(out));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// A writer that refuses to grow past a limit.
struct Bounded {
    buf: Vec<u8>,
    max: usize,
    overflowed: bool,
}

impl io::Write for Bounded {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.max {
            self.overflowed = true;
            return Err(io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// Compiles `source` with the default limits. `bos_token`/`eos_token` are the token texts
    /// templates see as `bos_token` / `eos_token`.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, TemplateError> {
        ChatTemplate::with_limits(source, bos_token, eos_token, TemplateLimits::default())
    }

    pub fn with_limits(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        limits: TemplateLimits,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_recursion_limit(limits.max_recursion);
        env.set_fuel(Some(limits.fuel));
        env.set_unknown_method_callback(unknown_method);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("from_json", from_json);
        env.add_test("iterable", is_iterable);
        env.add_filter("length", length);
        env.add_filter("count", length);
        env.add_function(ACYCLIC_FN, acyclic);
        let compiled = guard_namespace_sets(&strip_generation_tags(&patch_source(source)));
        env.add_template_owned(NAME, compiled)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        let mut t = ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            limits,
            supports_system_role: true,
            strip_bos: false,
            strip_eos: false,
            source: source.to_string(),
        };
        let needle = "<System Needle 7d1f>";
        let probe = [
            ChatMessage::new("system", needle),
            ChatMessage::new("user", "Hey"),
        ];
        t.supports_system_role = t
            .render_raw(&probe, None, false, &serde_json::Map::new())
            .is_ok_and(|out| out.contains(needle));
        Ok(t)
    }

    /// The model's own template (`tokenizer.chat_template`), or ChatML when it has none (as
    /// llama.cpp's common chat code falls back), with the model's BOS/EOS texts.
    pub fn from_tokenizer(tok: &crate::Tokenizer) -> Result<ChatTemplate, TemplateError> {
        ChatTemplate::from_tokenizer_with(tok, None)
    }

    /// [`ChatTemplate::from_tokenizer`] with `source` in place of the model's template
    /// (llama.cpp's `--chat-template` / `--chat-template-file`; `chatml` means ChatML).
    pub fn from_tokenizer_with(
        tok: &crate::Tokenizer,
        source: Option<&str>,
    ) -> Result<ChatTemplate, TemplateError> {
        let text = |id: Option<crate::TokenId>| {
            id.map(|id| String::from_utf8_lossy(&tok.token_to_piece(id, true)).into_owned())
                .unwrap_or_default()
        };
        // llama.cpp: the default template, else the "tool_use" one, else ChatML.
        let source = source
            .or(tok.chat_template())
            .or(tok.chat_template_tool_use())
            .unwrap_or(CHATML_TEMPLATE);
        let mut t = ChatTemplate::new(source, &text(tok.bos()), &text(tok.eos()))?;
        t.strip_bos = tok.add_bos();
        t.strip_eos = tok.add_eos();
        Ok(t)
    }

    /// Whether the template renders system messages itself (else they are folded into the
    /// first user message).
    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn supports_system_role(&self) -> bool {
        self.supports_system_role
    }

    /// Renders a conversation. `tools` (an array of OpenAI tool definitions) is passed as
    /// `tools` when given and non-empty (undefined otherwise, as in llama.cpp).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with(
            messages,
            tools,
            add_generation_prompt,
            &serde_json::Map::new(),
        )
    }

    /// [`ChatTemplate::render`] with extra template variables (e.g. `enable_thinking: false`,
    /// `reasoning_effort`), which override the defaults.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let mut out = self.render_folded(messages, tools, add_generation_prompt, extra)?;
        if self.strip_bos && !self.bos_token.is_empty() && out.starts_with(&self.bos_token) {
            out.drain(..self.bos_token.len());
        }
        if self.strip_eos && !self.eos_token.is_empty() && out.ends_with(&self.eos_token) {
            out.truncate(out.len() - self.eos_token.len());
        }
        Ok(out)
    }

    fn render_folded(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        if self.supports_system_role || !messages.iter().any(|m| m.role == "system") {
            return self.render_raw(messages, tools, add_generation_prompt, extra);
        }
        let mut folded: Vec<ChatMessage> = Vec::with_capacity(messages.len());
        let mut pending = String::new();
        for m in messages {
            if m.role == "system" {
                if !pending.is_empty() {
                    pending.push('\n');
                }
                pending.push_str(&m.content);
                continue;
            }
            let mut m = m.clone();
            if m.role == "user" && !pending.is_empty() {
                m.content = if m.content.is_empty() {
                    std::mem::take(&mut pending)
                } else {
                    format!("{}\n{}", std::mem::take(&mut pending), m.content)
                };
            }
            folded.push(m);
        }
        if !pending.is_empty() {
            folded.push(ChatMessage::new("user", pending));
        }
        self.render_raw(&folded, tools, add_generation_prompt, extra)
    }

    fn render_raw(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        let tools = tools.filter(|t| !(t.is_null() || t.as_array().is_some_and(|a| a.is_empty())));
        let base = minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools.map_or(Value::UNDEFINED, Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            enable_thinking => true,
            // Variables llama.cpp provides for templates that read them (FireFunction).
            functions => tools.map_or(String::new(), |t| serde_json::to_string_pretty(t).unwrap_or_default()),
            datetime => strftime_now("%b %d %Y".to_string()),
            date_string => strftime_now("%d %b %Y".to_string()),
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let ctx = minijinja::context! { ..Value::from_serialize(extra), ..base };
        let mut out = Bounded {
            buf: Vec::new(),
            max: self.limits.max_output,
            overflowed: false,
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => Ok(String::from_utf8_lossy(&out.buf).into_owned()),
            Err(_) if out.overflowed => Err(TemplateError::OutputTooLarge(self.limits.max_output)),
            Err(e) => Err(classify(&e)),
        }
    }
}

fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn classify(e: &Error) -> TemplateError {
    let text = describe(e);
    if e.kind() == ErrorKind::OutOfFuel {
        TemplateError::OutOfFuel
    } else if let Some(msg) = e.detail().and_then(|d| d.strip_prefix("raise_exception: ")) {
        TemplateError::Raised(msg.to_string())
    } else {
        TemplateError::Render(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats() {
        // 2024-07-26 12:34:56 UTC was a Friday.
        let t = 1_721_997_296;
        assert_eq!(strftime_at("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime_at("%Y-%m-%d %H:%M:%S %A %B %-d", t),
            "2024-07-26 12:34:56 Friday July 26"
        );
    }

    #[test]
    fn tojson_matches_python() {
        let t = ChatTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ s | tojson(ensure_ascii=True) }}|{{ s | tojson }}",
            "",
            "",
        )
        .unwrap();
        let tmpl = t.env.get_template(NAME).unwrap();
        let out = tmpl
            .render(minijinja::context! { x => serde_json::json!({"a": [1, 2.0], "b": "c"}), s => "é\"" })
            .unwrap();
        assert_eq!(
            out,
            "{\"a\": [1, 2.0], \"b\": \"c\"}|{\n  \"a\": [\n    1,\n    2.0\n  ],\n  \"b\": \"c\"\n}|\"\\u00e9\\\"\"|\"é\\\"\""
        );
    }

    #[test]
    fn generation_tags_render_their_body() {
        // Twice: the rewrite's regex is built once and reused.
        for _ in 0..2 {
            let t = ChatTemplate::new(
                "{% for m in messages %}{% generation %}[{{ m.content }}]{%- endgeneration -%} {% endfor %}",
                "",
                "",
            )
            .unwrap();
            let msgs = [
                ChatMessage::new("user", "a"),
                ChatMessage::new("assistant", "b"),
            ];
            assert_eq!(t.render(&msgs, None, false).unwrap(), "[a][b]");
        }
    }

    #[test]
    fn chatml_fallback() {
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "").unwrap();
        let msgs = [ChatMessage::new("user", "hi")];
        assert_eq!(
            t.render(&msgs, None, true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}

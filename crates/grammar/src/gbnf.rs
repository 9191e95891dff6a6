//! llama.cpp's GBNF grammar language: the parser of `src/llama-grammar.cpp`
//! (`llama_grammar_parser`), producing the same rules, the same generated rule names
//! and ids, and so the same accepted language. Errors carry the line and column.
//!
//! Differences, all on input llama.cpp mishandles: `{m,n}` with `n < m` is an error
//! (llama.cpp loops), nesting of groups is bounded (llama.cpp recurses without bound),
//! and the left-recursion check visits each rule once (llama.cpp's can take
//! exponential time on shared sub-rules). One more on input llama.cpp runs
//! exponentially slowly: `*`, `+` and `?` stacked on one symbol (`X+++*`) make the one
//! repetition they mean (`X*`) rather than a rule each, the same language. And left
//! recursion through a rule that derives the empty text without an empty alternative
//! (`term ::= ws expr ")"` with `ws ::= [ ]*`), on which llama.cpp's matcher recurses
//! without end, is refused as left recursion.

use std::collections::BTreeMap;
use std::fmt;

/// Repetitions above this are refused or made unbounded, as in llama.cpp.
const MAX_REPETITION_THRESHOLD: u64 = 2000;

/// How deep `( ( ( … ) ) )` may nest before the parser gives up.
pub const MAX_NESTING: usize = 256;

/// One grammar element (`llama_grammar_element`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Element {
    /// End of a rule definition.
    End,
    /// Start of an alternative definition of the rule.
    Alt,
    /// Reference to a rule by id.
    RuleRef(u32),
    /// A code point; starts a character class.
    Char(u32),
    /// `[^…]`: starts a negated character class.
    CharNot(u32),
    /// Makes the preceding `Char`/`CharAlt` the lower end of an inclusive range.
    CharRngUpper(u32),
    /// Adds an alternative character to the class.
    CharAlt(u32),
    /// `.`: any code point.
    CharAny,
    /// `<[id]>`: one specific token.
    Token(u32),
    /// `!<[id]>`: any token but this one.
    TokenNot(u32),
}

impl Element {
    /// End of one alternative of a rule.
    pub fn is_end_of_sequence(self) -> bool {
        matches!(self, Element::End | Element::Alt)
    }
    /// An element that starts a character class (a terminal matched against a code point).
    pub fn is_char_start(self) -> bool {
        matches!(
            self,
            Element::Char(_) | Element::CharNot(_) | Element::CharAny
        )
    }
}

/// `*`, `+` or `?`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rep {
    Star,
    Plus,
    Opt,
}

/// A rule: alternatives separated by `Alt`, ended by `End`.
pub type Rule = Vec<Element>;

/// A parsed grammar: rules indexed by symbol id, and the symbol names.
#[derive(Clone, Debug, PartialEq)]
pub struct Grammar {
    pub rules: Vec<Rule>,
    /// Name → id, as llama.cpp's `symbol_ids` (generated names are `base_N`).
    pub symbol_ids: BTreeMap<String, u32>,
    /// Id of the start rule.
    pub root: u32,
}

/// Why a grammar was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error("grammar parse error at line {line}, column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("grammar uses undefined rule '{0}'")]
    UndefinedRule(String),
    #[error("grammar has no '{0}' rule")]
    NoRoot(String),
    #[error("grammar is empty")]
    Empty,
    #[error("grammar is left-recursive at rule '{0}', which llama.cpp's grammar engine cannot run")]
    LeftRecursion(String),
    #[error("grammar can never end: rule '{0}' derives no finite text")]
    NeverEnds(String),
}

/// Looks up `<name>` token references; gets the whole text with the brackets, like
/// llama.cpp's tokenization with special tokens, and returns the single token it is.
pub type TokenResolver<'a> = &'a dyn Fn(&str) -> Option<u32>;

struct Parser<'a> {
    src: &'a [u8],
    symbol_ids: BTreeMap<String, u32>,
    rules: Vec<Rule>,
    resolve: Option<TokenResolver<'a>>,
    depth: usize,
}

type PResult<T> = Result<T, GrammarError>;

fn is_digit(c: u8) -> bool {
    c.is_ascii_digit()
}

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl<'a> Parser<'a> {
    /// The byte at `i`, 0 past the end (the C parser's terminator).
    fn at(&self, i: usize) -> u8 {
        self.src.get(i).copied().unwrap_or(0)
    }

    fn err<T>(&self, pos: usize, message: impl Into<String>) -> PResult<T> {
        let pos = pos.min(self.src.len());
        let before = &self.src[..pos];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1);
        let column = String::from_utf8_lossy(&self.src[line_start..pos])
            .chars()
            .count()
            + 1;
        let mut message = message.into();
        let rest: String = String::from_utf8_lossy(&self.src[pos..])
            .chars()
            .take_while(|&c| c != '\n')
            .take(40)
            .collect();
        if rest.is_empty() {
            message.push_str(" (at end of input)");
        } else {
            message.push_str(&format!(" (at `{rest}`)"));
        }
        Err(GrammarError::Syntax {
            line,
            column,
            message,
        })
    }

    fn parse_space(&self, mut pos: usize, newline_ok: bool) -> usize {
        loop {
            match self.at(pos) {
                b' ' | b'\t' => pos += 1,
                b'\r' | b'\n' if newline_ok => pos += 1,
                b'#' => {
                    while !matches!(self.at(pos), 0 | b'\r' | b'\n') {
                        pos += 1;
                    }
                }
                _ => return pos,
            }
        }
    }

    fn parse_name(&self, src: usize) -> PResult<usize> {
        let mut pos = src;
        while is_word_char(self.at(pos)) {
            pos += 1;
        }
        if pos == src {
            return self.err(src, "expecting name");
        }
        Ok(pos)
    }

    fn parse_int(&self, src: usize) -> PResult<usize> {
        let mut pos = src;
        while is_digit(self.at(pos)) {
            pos += 1;
        }
        if pos == src {
            return self.err(src, "expecting integer");
        }
        Ok(pos)
    }

    fn parse_hex(&self, src: usize, size: usize) -> PResult<(u32, usize)> {
        let mut pos = src;
        let end = src + size;
        let mut value: u32 = 0;
        while pos < end && self.at(pos) != 0 {
            let c = self.at(pos);
            let d = match c {
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                b'0'..=b'9' => c - b'0',
                _ => break,
            };
            value = (value << 4).wrapping_add(u32::from(d));
            pos += 1;
        }
        if pos != end {
            return self.err(src, format!("expecting {size} hex chars"));
        }
        Ok((value, pos))
    }

    /// One UTF-8 sequence, as llama.cpp's lenient `decode_utf8` (stops at the end).
    fn decode_utf8(&self, src: usize) -> (u32, usize) {
        const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
        let first = self.at(src);
        let len = LOOKUP[usize::from(first >> 4)];
        let mask = (1u32 << (8 - len)) - 1;
        let mut value = u32::from(first) & mask;
        let end = src + len;
        let mut pos = src + 1;
        while pos < end && self.at(pos) != 0 {
            value = (value << 6) + (u32::from(self.at(pos)) & 0x3f);
            pos += 1;
        }
        (value, pos)
    }

    fn parse_char(&self, src: usize) -> PResult<(u32, usize)> {
        let c = self.at(src);
        if c == b'\\' {
            match self.at(src + 1) {
                b'x' => self.parse_hex(src + 2, 2),
                b'u' => self.parse_hex(src + 2, 4),
                b'U' => self.parse_hex(src + 2, 8),
                b't' => Ok((u32::from(b'\t'), src + 2)),
                b'r' => Ok((u32::from(b'\r'), src + 2)),
                b'n' => Ok((u32::from(b'\n'), src + 2)),
                e @ (b'\\' | b'"' | b'[' | b']' | b'-') => Ok((u32::from(e), src + 2)),
                _ => self.err(src, "unknown escape"),
            }
        } else if c != 0 {
            Ok(self.decode_utf8(src))
        } else {
            self.err(src, "unexpected end of input")
        }
    }

    fn parse_token(&self, src: usize) -> PResult<(u32, usize)> {
        let mut pos = src;
        if self.at(pos) != b'<' {
            return self.err(pos, "expecting '<'");
        }
        pos += 1;
        if self.at(pos) == b'[' {
            pos += 1;
            let int_end = self.parse_int(pos)?;
            let digits = std::str::from_utf8(&self.src[pos..int_end]).unwrap_or("");
            let id: u32 = match digits.parse() {
                Ok(id) => id,
                Err(_) => return self.err(pos, "parsed token id is too big"),
            };
            pos = int_end;
            if self.at(pos) != b']' {
                return self.err(pos, "expecting ']'");
            }
            pos += 1;
            if self.at(pos) != b'>' {
                return self.err(pos, "expecting '>'");
            }
            return Ok((id, pos + 1));
        }
        let Some(resolve) = self.resolve else {
            return self.err(src, "no vocabulary to resolve a token name");
        };
        while self.at(pos) != 0 && self.at(pos) != b'>' {
            pos += 1;
        }
        if self.at(pos) != b'>' {
            return self.err(pos, "expecting '>'");
        }
        pos += 1;
        let text = String::from_utf8_lossy(&self.src[src..pos]);
        match resolve(&text) {
            Some(id) => Ok((id, pos)),
            None => self.err(
                src,
                format!("invalid token '{text}' (not exactly one token)"),
            ),
        }
    }

    fn get_symbol_id(&mut self, name: &[u8]) -> u32 {
        let next = self.symbol_ids.len() as u32;
        *self
            .symbol_ids
            .entry(String::from_utf8_lossy(name).into_owned())
            .or_insert(next)
    }

    fn generate_symbol_id(&mut self, base: &str) -> u32 {
        let next = self.symbol_ids.len() as u32;
        self.symbol_ids.insert(format!("{base}_{next}"), next);
        next
    }

    fn add_rule(&mut self, id: u32, rule: Rule) {
        let id = id as usize;
        if self.rules.len() <= id {
            self.rules.resize(id + 1, Vec::new());
        }
        self.rules[id] = rule;
    }

    fn parse_alternates(
        &mut self,
        src: usize,
        rule_name: &str,
        rule_id: u32,
        is_nested: bool,
    ) -> PResult<usize> {
        let mut rule = Vec::new();
        let mut pos = self.parse_sequence(src, rule_name, &mut rule, is_nested)?;
        while self.at(pos) == b'|' {
            rule.push(Element::Alt);
            pos = self.parse_space(pos + 1, true);
            pos = self.parse_sequence(pos, rule_name, &mut rule, is_nested)?;
        }
        rule.push(Element::End);
        self.add_rule(rule_id, rule);
        Ok(pos)
    }

    /// S{m,n} → S…S (m times) then n−m nested optional rules, as llama.cpp rewrites it.
    #[allow(clippy::too_many_arguments)]
    fn handle_repetitions(
        &mut self,
        pos: usize,
        rule_name: &str,
        rule: &mut Rule,
        last_sym_start: usize,
        n_prev_rules: &mut u64,
        min_times: u64,
        max_times: Option<u64>,
    ) -> PResult<u32> {
        if last_sym_start == rule.len() {
            return self.err(pos, "expecting preceding item to */+/?/{");
        }
        if let Some(max) = max_times
            && max < min_times
        {
            return self.err(
                pos,
                format!("repetition {{{min_times},{max}}} has max < min"),
            );
        }
        let prev_rule: Rule = rule[last_sym_start..].to_vec();
        let total_rules = match max_times {
            Some(max) if max > 0 => max,
            _ if min_times > 0 => min_times,
            _ => 1,
        };
        if n_prev_rules.saturating_mul(total_rules) > MAX_REPETITION_THRESHOLD {
            return self.err(
                pos,
                "number of rules that are going to be repeated multiplied by the new repetition exceeds sane defaults, please reduce the number of repetitions or rule complexity",
            );
        }
        if min_times == 0 {
            rule.truncate(last_sym_start);
        } else {
            for _ in 1..min_times {
                rule.extend_from_slice(&prev_rule);
            }
        }
        let mut last_rec_rule_id = 0;
        let n_opt = match max_times {
            None => 1,
            Some(max) => max - min_times,
        };
        for i in 0..n_opt {
            let mut rec_rule = prev_rule.clone();
            let rec_rule_id = self.generate_symbol_id(rule_name);
            if i > 0 || max_times.is_none() {
                rec_rule.push(Element::RuleRef(if max_times.is_none() {
                    rec_rule_id
                } else {
                    last_rec_rule_id
                }));
            }
            rec_rule.push(Element::Alt);
            rec_rule.push(Element::End);
            self.add_rule(rec_rule_id, rec_rule);
            last_rec_rule_id = rec_rule_id;
        }
        if n_opt > 0 {
            rule.push(Element::RuleRef(last_rec_rule_id));
        }
        *n_prev_rules *= total_rules;
        Ok(last_rec_rule_id)
    }

    /// `*`, `+` or `?` after a symbol that already carries one of them (`last`: the
    /// operator and the rule it generated). The two nest to one of the three
    /// (`X++` is `X+`; `X+*`, `X*+`, `X?*`, `X+?`, ... are `X*`; `X??` is `X?`), so the
    /// nesting is rewritten to that one rather than generating a rule per operator:
    /// nested repetitions of one symbol are ambiguous, and the matcher's stacks for
    /// them grow exponentially with the text. No grammar of llama.cpp's tests has them;
    /// the language is the same. Returns the operator the symbol now carries.
    fn nest_repetition(
        &mut self,
        rule: &mut Rule,
        last_sym_start: usize,
        last: (Rep, u32),
        op: Rep,
    ) -> (Rep, u32) {
        let (inner, id) = last;
        match (inner, op) {
            (Rep::Star, _) | (Rep::Plus, Rep::Plus) | (Rep::Opt, Rep::Opt) => last,
            // `X+` is `X r` with `r ::= X r | ε`, and `r` is `X*`.
            (Rep::Plus, _) => {
                rule.truncate(last_sym_start);
                rule.push(Element::RuleRef(id));
                (Rep::Star, id)
            }
            // `X?` is `r` with `r ::= X | ε`; `r ::= X r | ε` is `X*`.
            (Rep::Opt, _) => {
                let r = &mut self.rules[id as usize];
                let at = r.len() - 2;
                r.insert(at, Element::RuleRef(id));
                (Rep::Star, id)
            }
        }
    }

    fn parse_sequence(
        &mut self,
        src: usize,
        rule_name: &str,
        rule: &mut Rule,
        is_nested: bool,
    ) -> PResult<usize> {
        let mut last_sym_start = rule.len();
        let mut pos = src;
        let mut n_prev_rules: u64 = 1;
        // The `*`/`+`/`?` the last symbol carries, with the rule it generated.
        let mut last_rep: Option<(Rep, u32)> = None;
        loop {
            let c = self.at(pos);
            if c == 0 {
                break;
            }
            if !matches!(c, b'*' | b'+' | b'?' | b'{') {
                last_rep = None;
            }
            if c == b'"' {
                pos += 1;
                last_sym_start = rule.len();
                n_prev_rules = 1;
                while self.at(pos) != b'"' {
                    if self.at(pos) == 0 {
                        return self.err(pos, "unexpected end of input");
                    }
                    let (ch, next) = self.parse_char(pos)?;
                    pos = next;
                    rule.push(Element::Char(ch));
                }
                pos = self.parse_space(pos + 1, is_nested);
            } else if c == b'[' {
                pos += 1;
                let negated = self.at(pos) == b'^';
                if negated {
                    pos += 1;
                }
                last_sym_start = rule.len();
                n_prev_rules = 1;
                while self.at(pos) != b']' {
                    if self.at(pos) == 0 {
                        return self.err(pos, "unexpected end of input");
                    }
                    let (ch, next) = self.parse_char(pos)?;
                    pos = next;
                    rule.push(if last_sym_start < rule.len() {
                        Element::CharAlt(ch)
                    } else if negated {
                        Element::CharNot(ch)
                    } else {
                        Element::Char(ch)
                    });
                    if self.at(pos) == b'-' && self.at(pos + 1) != b']' {
                        if self.at(pos + 1) == 0 {
                            return self.err(pos + 1, "unexpected end of input");
                        }
                        let (end, next) = self.parse_char(pos + 1)?;
                        pos = next;
                        rule.push(Element::CharRngUpper(end));
                    }
                }
                pos = self.parse_space(pos + 1, is_nested);
            } else if c == b'<' || c == b'!' {
                let negated = c == b'!';
                if negated {
                    pos += 1;
                }
                let (id, end) = self.parse_token(pos)?;
                last_sym_start = rule.len();
                n_prev_rules = 1;
                rule.push(if negated {
                    Element::TokenNot(id)
                } else {
                    Element::Token(id)
                });
                pos = self.parse_space(end, is_nested);
            } else if is_word_char(c) {
                let name_end = self.parse_name(pos)?;
                let ref_id = self.get_symbol_id(&self.src[pos..name_end]);
                pos = self.parse_space(name_end, is_nested);
                last_sym_start = rule.len();
                n_prev_rules = 1;
                rule.push(Element::RuleRef(ref_id));
            } else if c == b'(' {
                if self.depth >= MAX_NESTING {
                    return self.err(pos, format!("groups nest deeper than {MAX_NESTING}"));
                }
                pos = self.parse_space(pos + 1, true);
                let n_rules_before = self.symbol_ids.len() as u64;
                let sub_id = self.generate_symbol_id(rule_name);
                self.depth += 1;
                pos = self.parse_alternates(pos, rule_name, sub_id, true)?;
                self.depth -= 1;
                n_prev_rules = (self.symbol_ids.len() as u64 - n_rules_before).max(1);
                last_sym_start = rule.len();
                rule.push(Element::RuleRef(sub_id));
                if self.at(pos) != b')' {
                    return self.err(pos, "expecting ')'");
                }
                pos = self.parse_space(pos + 1, is_nested);
            } else if c == b'.' {
                last_sym_start = rule.len();
                n_prev_rules = 1;
                rule.push(Element::CharAny);
                pos = self.parse_space(pos + 1, is_nested);
            } else if c == b'*' || c == b'+' || c == b'?' {
                let op = pos;
                pos = self.parse_space(pos + 1, is_nested);
                let (rep, min, max) = match c {
                    b'*' => (Rep::Star, 0, None),
                    b'+' => (Rep::Plus, 1, None),
                    _ => (Rep::Opt, 0, Some(1)),
                };
                last_rep = Some(match last_rep {
                    Some(last) => self.nest_repetition(rule, last_sym_start, last, rep),
                    None => {
                        let id = self.handle_repetitions(
                            op,
                            rule_name,
                            rule,
                            last_sym_start,
                            &mut n_prev_rules,
                            min,
                            max,
                        )?;
                        (rep, id)
                    }
                });
            } else if c == b'{' {
                let op = pos;
                pos = self.parse_space(pos + 1, is_nested);
                if !is_digit(self.at(pos)) {
                    return self.err(pos, "expecting an int");
                }
                let int_end = self.parse_int(pos)?;
                let min_times = self.parse_u64(pos, int_end)?;
                pos = self.parse_space(int_end, is_nested);
                let mut max_times = None;
                if self.at(pos) == b'}' {
                    max_times = Some(min_times);
                    pos = self.parse_space(pos + 1, is_nested);
                } else if self.at(pos) == b',' {
                    pos = self.parse_space(pos + 1, is_nested);
                    if is_digit(self.at(pos)) {
                        let int_end = self.parse_int(pos)?;
                        max_times = Some(self.parse_u64(pos, int_end)?);
                        pos = self.parse_space(int_end, is_nested);
                    }
                    if self.at(pos) != b'}' {
                        return self.err(pos, "expecting '}'");
                    }
                    pos = self.parse_space(pos + 1, is_nested);
                } else {
                    return self.err(pos, "expecting ','");
                }
                if min_times > MAX_REPETITION_THRESHOLD {
                    return self.err(
                        op,
                        "number of repetitions exceeds sane defaults, please reduce the number of repetitions",
                    );
                }
                // llama.cpp makes a too-large maximum unbounded rather than refusing it.
                if max_times.is_some_and(|m| m > MAX_REPETITION_THRESHOLD) {
                    max_times = None;
                }
                last_rep = None;
                self.handle_repetitions(
                    op,
                    rule_name,
                    rule,
                    last_sym_start,
                    &mut n_prev_rules,
                    min_times,
                    max_times,
                )?;
            } else {
                break;
            }
        }
        Ok(pos)
    }

    fn parse_u64(&self, start: usize, end: usize) -> PResult<u64> {
        std::str::from_utf8(&self.src[start..end])
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or_else(|| self.err(start, "integer out of range"), Ok)
    }

    fn parse_rule(&mut self, src: usize) -> PResult<usize> {
        let name_end = self.parse_name(src)?;
        let mut pos = self.parse_space(name_end, false);
        let name = String::from_utf8_lossy(&self.src[src..name_end]).into_owned();
        let rule_id = self.get_symbol_id(&self.src[src..name_end]);
        if !(self.at(pos) == b':' && self.at(pos + 1) == b':' && self.at(pos + 2) == b'=') {
            return self.err(pos, "expecting ::=");
        }
        pos = self.parse_space(pos + 3, true);
        pos = self.parse_alternates(pos, &name, rule_id, false)?;
        match self.at(pos) {
            b'\r' => pos += if self.at(pos + 1) == b'\n' { 2 } else { 1 },
            b'\n' => pos += 1,
            0 => {}
            _ => return self.err(pos, "expecting newline or end"),
        }
        Ok(self.parse_space(pos, true))
    }
}

impl Grammar {
    /// Parses GBNF text with `root` as the start rule. `resolve` maps `<name>` token
    /// references to ids (without it only `<[id]>` references parse).
    pub fn parse(
        src: &str,
        root: &str,
        resolve: Option<TokenResolver<'_>>,
    ) -> Result<Grammar, GrammarError> {
        let mut p = Parser {
            src: src.as_bytes(),
            symbol_ids: BTreeMap::new(),
            rules: Vec::new(),
            resolve,
            depth: 0,
        };
        let mut pos = p.parse_space(0, true);
        while p.at(pos) != 0 {
            pos = p.parse_rule(pos)?;
        }
        if p.rules.is_empty() {
            return Err(GrammarError::Empty);
        }
        let name_of = |id: u32| {
            p.symbol_ids
                .iter()
                .find(|(_, v)| **v == id)
                .map_or_else(|| id.to_string(), |(k, _)| k.clone())
        };
        for (id, rule) in p.rules.iter().enumerate() {
            if rule.is_empty() {
                return Err(GrammarError::UndefinedRule(name_of(id as u32)));
            }
            for e in rule {
                if let Element::RuleRef(r) = *e
                    && p.rules.get(r as usize).is_none_or(|r| r.is_empty())
                {
                    return Err(GrammarError::UndefinedRule(name_of(r)));
                }
            }
        }
        let Some(&root_id) = p.symbol_ids.get(root) else {
            return Err(GrammarError::NoRoot(root.to_string()));
        };
        let g = Grammar {
            rules: p.rules,
            symbol_ids: p.symbol_ids,
            root: root_id,
        };
        if let Some(r) = g
            .left_recursive_rule()
            .or_else(|| g.growing_left_recursion())
        {
            return Err(GrammarError::LeftRecursion(g.name_of(r)));
        }
        if !g.productive()[g.root as usize] {
            return Err(GrammarError::NeverEnds(g.name_of(g.root)));
        }
        Ok(g)
    }

    /// The name of rule `id`.
    pub fn name_of(&self, id: u32) -> String {
        self.symbol_ids
            .iter()
            .find(|(_, v)| **v == id)
            .map_or_else(|| id.to_string(), |(k, _)| k.clone())
    }

    /// Which rules derive some finite text: the usual worklist fixpoint, linear in the
    /// grammar's size. A grammar whose root is not productive can never end.
    fn productive(&self) -> Vec<bool> {
        // `[5-1]` matches nothing: an alternative with such a class derives nothing.
        self.derives(|rule, i| matches!(rule[i], Element::Char(_)) && class_is_empty(&rule[i..]))
    }

    /// Which rules derive the empty text: the same fixpoint with every terminal blocking
    /// its alternative.
    fn nullable(&self) -> Vec<bool> {
        self.derives(|_, _| true)
    }

    /// The worklist fixpoint behind [`Grammar::productive`] and [`Grammar::nullable`]: a rule
    /// derives when one of its alternatives has only deriving references and no terminal
    /// element `blocks(rule, i)` says stops it.
    fn derives(&self, blocks: impl Fn(&[Element], usize) -> bool) -> Vec<bool> {
        let n = self.rules.len();
        // Per alternative: its rule and how many of its references are not yet known to
        // derive; users[r]: the alternatives referencing r, once per reference.
        let mut alt_rule = Vec::new();
        let mut pending = Vec::new();
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (r, rule) in self.rules.iter().enumerate() {
            let mut count = 0usize;
            for (i, e) in rule.iter().enumerate() {
                match *e {
                    Element::RuleRef(c) => {
                        count += 1;
                        users[c as usize].push(alt_rule.len());
                    }
                    e if e.is_end_of_sequence() => {
                        alt_rule.push(r);
                        pending.push(count);
                        count = 0;
                    }
                    _ if blocks(rule, i) => count = usize::MAX / 2,
                    _ => {}
                }
            }
        }
        let mut derives = vec![false; n];
        let mut work: Vec<usize> = Vec::new();
        for (alt, &c) in pending.iter().enumerate() {
            let r = alt_rule[alt];
            if c == 0 && !derives[r] {
                derives[r] = true;
                work.push(r);
            }
        }
        while let Some(r) = work.pop() {
            for &alt in &users[r] {
                pending[alt] -= 1;
                let owner = alt_rule[alt];
                if pending[alt] == 0 && !derives[owner] {
                    derives[owner] = true;
                    work.push(owner);
                }
            }
        }
        derives
    }

    /// Left recursion the stacks grow on without end, which llama.cpp's check misses:
    /// through a rule that derives the empty text without an empty alternative
    /// (`ws ::= [ ]*` is `ws ::= ws_N`), as in `term ::= ws expr ")"`, `expr ::= term`.
    /// llama.cpp's matcher recurses without end on these. It is a cycle of leftmost
    /// references (past rules that derive the empty text) with a reference that has
    /// something after it (each turn pushes that continuation); a cycle of references
    /// in last position only (`r ::= ( [x]* ) r`) pops back to the same stack and is
    /// fine. Kosaraju's strongly connected components, iteratively.
    fn growing_left_recursion(&self) -> Option<u32> {
        let n = self.rules.len();
        let nullable = self.nullable();
        let mut adj: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut pushing: Vec<(usize, usize)> = Vec::new();
        for (r, rule) in self.rules.iter().enumerate() {
            let mut leftmost = true;
            for (i, e) in rule.iter().enumerate() {
                match *e {
                    Element::RuleRef(c) if leftmost => {
                        let c = c as usize;
                        adj[r].push(c);
                        if !rule.get(i + 1).is_none_or(|e| e.is_end_of_sequence()) {
                            pushing.push((r, c));
                        }
                        leftmost = nullable[c];
                    }
                    e if e.is_end_of_sequence() => leftmost = true,
                    _ => leftmost = false,
                }
            }
        }
        if pushing.is_empty() {
            return None;
        }
        // Finish order of a depth-first search over `adj`.
        let mut order = Vec::with_capacity(n);
        let mut visited = vec![false; n];
        for start in 0..n {
            if visited[start] {
                continue;
            }
            visited[start] = true;
            let mut frames = vec![(start, 0usize)];
            while let Some((u, i)) = frames.last_mut() {
                if let Some(&v) = adj[*u].get(*i) {
                    *i += 1;
                    if !visited[v] {
                        visited[v] = true;
                        frames.push((v, 0));
                    }
                } else {
                    order.push(*u);
                    frames.pop();
                }
            }
        }
        // Components: searches of the reversed graph in reverse finish order.
        let mut radj: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (u, vs) in adj.iter().enumerate() {
            for &v in vs {
                radj[v].push(u);
            }
        }
        let mut comp = vec![usize::MAX; n];
        for (k, &start) in order.iter().rev().enumerate() {
            if comp[start] != usize::MAX {
                continue;
            }
            comp[start] = k;
            let mut todo = vec![start];
            while let Some(u) = todo.pop() {
                for &v in &radj[u] {
                    if comp[v] == usize::MAX {
                        comp[v] = k;
                        todo.push(v);
                    }
                }
            }
        }
        pushing
            .into_iter()
            .find(|&(u, v)| comp[u] == comp[v])
            .map(|(_, v)| v as u32)
    }

    /// llama.cpp's `llama_grammar_detect_left_recursion` over all rules, as an
    /// iterative depth-first search (hostile grammars must not overflow the stack).
    /// "May be empty" is llama.cpp's: the rule has an empty alternative.
    fn left_recursive_rule(&self) -> Option<u32> {
        let n = self.rules.len();
        let may_be_empty: Vec<bool> = self
            .rules
            .iter()
            .map(|rule| {
                let mut at_start = true;
                for e in rule {
                    if e.is_end_of_sequence() {
                        if at_start {
                            return true;
                        }
                        at_start = true;
                    } else {
                        at_start = false;
                    }
                }
                false
            })
            .collect();
        // 0 = unvisited, 1 = in progress, 2 = done.
        let mut state = vec![0u8; n];
        for start in 0..n {
            if state[start] != 0 {
                continue;
            }
            // Frames: (rule, next element index, recurse-into-nonterminal flag).
            let mut frames: Vec<(usize, usize, bool)> = vec![(start, 0, true)];
            state[start] = 1;
            while let Some(&mut (r, ref mut i, ref mut recurse)) = frames.last_mut() {
                let rule = &self.rules[r];
                if *i >= rule.len() {
                    state[r] = 2;
                    frames.pop();
                    continue;
                }
                let e = rule[*i];
                *i += 1;
                match e {
                    Element::RuleRef(c) if *recurse => {
                        let c = c as usize;
                        if !may_be_empty[c] {
                            *recurse = false;
                        }
                        match state[c] {
                            1 => return Some(c as u32),
                            0 => {
                                state[c] = 1;
                                frames.push((c, 0, true));
                            }
                            _ => {}
                        }
                    }
                    e if e.is_end_of_sequence() => *recurse = true,
                    _ => *recurse = false,
                }
            }
        }
        None
    }
}

/// Whether the positive class starting at `class[0]` matches no code point (every
/// range is reversed).
fn class_is_empty(class: &[Element]) -> bool {
    let mut i = 0;
    loop {
        let lo = match class.get(i) {
            Some(Element::Char(c)) if i == 0 => *c,
            Some(Element::CharAlt(c)) if i > 0 => *c,
            _ => return true,
        };
        let hi = match class.get(i + 1) {
            Some(Element::CharRngUpper(h)) => {
                i += 2;
                *h
            }
            _ => {
                i += 1;
                lo
            }
        };
        if lo <= hi {
            return false;
        }
    }
}

fn print_char(f: &mut fmt::Formatter<'_>, c: u32) -> fmt::Result {
    if (0x20..=0x7f).contains(&c) {
        write!(f, "{}", c as u8 as char)
    } else {
        write!(f, "<U+{c:04X}>")
    }
}

/// llama.cpp's `llama_grammar_parser::print` format (one rule per line).
impl fmt::Display for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (id, rule) in self.rules.iter().enumerate() {
            write!(f, "{} ::= ", self.name_of(id as u32))?;
            let body = &rule[..rule.len().saturating_sub(1)];
            for (i, &e) in body.iter().enumerate() {
                match e {
                    Element::End => {}
                    Element::Alt => write!(f, "| ")?,
                    Element::RuleRef(r) => write!(f, "{} ", self.name_of(r))?,
                    Element::Char(c) => {
                        write!(f, "[")?;
                        print_char(f, c)?;
                    }
                    Element::CharNot(c) => {
                        write!(f, "[^")?;
                        print_char(f, c)?;
                    }
                    Element::CharRngUpper(c) => {
                        write!(f, "-")?;
                        print_char(f, c)?;
                    }
                    Element::CharAlt(c) => print_char(f, c)?,
                    Element::CharAny => write!(f, ".")?,
                    Element::Token(t) => write!(f, "<[{t}]> ")?,
                    Element::TokenNot(t) => write!(f, "!<[{t}]> ")?,
                }
                let is_char = matches!(
                    e,
                    Element::Char(_)
                        | Element::CharNot(_)
                        | Element::CharAlt(_)
                        | Element::CharRngUpper(_)
                        | Element::CharAny
                );
                if is_char
                    && !matches!(
                        rule.get(i + 1),
                        Some(Element::CharAlt(_) | Element::CharRngUpper(_) | Element::CharAny)
                    )
                {
                    write!(f, "] ")?;
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Grammar, GrammarError> {
        Grammar::parse(s, "root", None)
    }

    #[test]
    fn parses_rules_and_generated_names() {
        let g = parse("root ::= a+ \"x\"?\na ::= [a-z0-9_] | \"q\"\n").unwrap();
        let names: Vec<&str> = g.symbol_ids.keys().map(String::as_str).collect();
        assert_eq!(names, ["a", "root", "root_2", "root_3"]);
        assert_eq!(
            g.rules[g.symbol_ids["a"] as usize][0],
            Element::Char('a' as u32)
        );
    }

    #[test]
    fn errors_have_positions() {
        let e = parse("root ::= \"a\"\nfoo ::= \"b\" )\n").unwrap_err();
        match e {
            GrammarError::Syntax { line, column, .. } => assert_eq!((line, column), (2, 13)),
            e => panic!("{e}"),
        }
        assert!(matches!(
            parse("root ::= x\n"),
            Err(GrammarError::UndefinedRule(n)) if n == "x"
        ));
        assert!(matches!(
            parse("root ::= root \"a\"\n"),
            Err(GrammarError::LeftRecursion(_))
        ));
        assert!(matches!(
            parse("root ::= \"a\"{3,2}\n"),
            Err(GrammarError::Syntax { .. })
        ));
        assert!(matches!(
            parse("root ::= \"a\" root\n"),
            Err(GrammarError::NeverEnds(_))
        ));
        assert!(parse("root ::= \"a\" root | \"b\"\n").is_ok());
        assert!(matches!(
            parse("root ::= [5-1]\n"),
            Err(GrammarError::NeverEnds(_))
        ));
        assert!(parse("root ::= [5-1] | [a-c9-1]\n").is_ok());
        let deep = format!("root ::= {}\"a\"{}\n", "(".repeat(5000), ")".repeat(5000));
        assert!(matches!(parse(&deep), Err(GrammarError::Syntax { .. })));
    }
}

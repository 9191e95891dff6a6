//! A literal port of llama.cpp's grammar engine (`llama_grammar_advance_stack`,
//! `llama_grammar_reject_candidates`, `llama_grammar_accept_impl`) with plain vectors
//! of stacks, slow and obviously faithful: the oracle the fast matcher is checked
//! against.
#![allow(dead_code)]

use lamina_grammar::{Element, Grammar, Partial};

/// A position: (rule, element index).
pub type Pos = (usize, usize);
pub type Stack = Vec<Pos>;

pub struct Reference<'g> {
    pub g: &'g Grammar,
    pub stacks: Vec<Stack>,
    pub partial: Partial,
}

fn elem(g: &Grammar, p: Pos) -> Element {
    g.rules[p.0][p.1]
}

fn advance(g: &Grammar, stack: Stack, out: &mut Vec<Stack>) {
    let mut todo = vec![stack];
    let mut seen: Vec<Stack> = Vec::new();
    while let Some(s) = todo.pop() {
        if seen.contains(&s) {
            continue;
        }
        seen.push(s.clone());
        let Some(&top) = s.last() else {
            if !out.contains(&s) {
                out.push(s);
            }
            continue;
        };
        match elem(g, top) {
            Element::RuleRef(r) => {
                let r = r as usize;
                let mut sub = 0;
                loop {
                    let mut next: Stack = s[..s.len() - 1].to_vec();
                    if !elem(g, (top.0, top.1 + 1)).is_end_of_sequence() {
                        next.push((top.0, top.1 + 1));
                    }
                    if !g.rules[r][sub].is_end_of_sequence() {
                        next.push((r, sub));
                    }
                    todo.push(next);
                    while !g.rules[r][sub].is_end_of_sequence() {
                        sub += 1;
                    }
                    if g.rules[r][sub] == Element::Alt {
                        sub += 1;
                    } else {
                        break;
                    }
                }
            }
            Element::End | Element::Alt | Element::CharAlt(_) | Element::CharRngUpper(_) => {
                panic!("stack left on {:?}", elem(g, top))
            }
            _ => {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
    }
}

/// (matched, position after the class)
fn match_char(g: &Grammar, mut p: Pos, c: u32) -> (bool, Pos) {
    let first = elem(g, p);
    let positive = matches!(first, Element::Char(_) | Element::CharAny);
    let mut found = false;
    loop {
        let e = elem(g, p);
        let v = match e {
            Element::Char(v) | Element::CharNot(v) | Element::CharAlt(v) => v,
            _ => 0,
        };
        if let Element::CharRngUpper(hi) = elem(g, (p.0, p.1 + 1)) {
            found = found || (v <= c && c <= hi);
            p.1 += 2;
        } else if e == Element::CharAny {
            found = true;
            p.1 += 1;
        } else {
            found = found || v == c;
            p.1 += 1;
        }
        if !matches!(elem(g, p), Element::CharAlt(_)) {
            break;
        }
    }
    (found == positive, p)
}

fn match_partial(g: &Grammar, mut p: Pos, partial: Partial) -> bool {
    let first = elem(g, p);
    let positive = matches!(first, Element::Char(_) | Element::CharAny);
    let n = partial.n_remain;
    if n < 0 || (n == 1 && partial.value < 2) {
        return false;
    }
    let mut low = partial.value << (n * 6);
    let high = low | ((1u32 << (n * 6)) - 1);
    if low == 0 {
        if n == 2 {
            low = 1 << 11;
        } else if n == 3 {
            low = 1 << 16;
        }
    }
    loop {
        let e = elem(g, p);
        let v = match e {
            Element::Char(v) | Element::CharNot(v) | Element::CharAlt(v) => v,
            _ => 0,
        };
        if let Element::CharRngUpper(hi) = elem(g, (p.0, p.1 + 1)) {
            if v <= high && low <= hi {
                return positive;
            }
            p.1 += 2;
        } else if e == Element::CharAny {
            return true;
        } else {
            if low <= v && v <= high {
                return positive;
            }
            p.1 += 1;
        }
        if !matches!(elem(g, p), Element::CharAlt(_)) {
            break;
        }
    }
    !positive
}

/// llama.cpp's `decode_utf8(std::string, partial)`, returning code points without
/// the terminating 0.
pub fn decode(src: &[u8], start: Partial) -> (Vec<u32>, Partial) {
    let mut out = Vec::new();
    let p = lamina_grammar_decode(src, start, &mut out);
    (out, p)
}

fn lamina_grammar_decode(src: &[u8], start: Partial, out: &mut Vec<u32>) -> Partial {
    const LOOKUP: [i32; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4];
    let mut pos = 0;
    let mut value = start.value;
    let mut n_remain = start.n_remain;
    while pos < src.len() && src[pos] != 0 && n_remain > 0 {
        let b = src[pos];
        if b >> 6 != 2 {
            return Partial {
                value: 0,
                n_remain: -1,
            };
        }
        value = (value << 6) + u32::from(b & 0x3f);
        pos += 1;
        n_remain -= 1;
    }
    if start.n_remain > 0 && n_remain == 0 {
        out.push(value);
    }
    while pos < src.len() && src[pos] != 0 {
        let first = src[pos];
        n_remain = LOOKUP[usize::from(first >> 4)] - 1;
        if n_remain < 0 {
            out.clear();
            return Partial { value: 0, n_remain };
        }
        value = u32::from(first) & ((1u32 << (7 - n_remain)) - 1);
        pos += 1;
        while pos < src.len() && src[pos] != 0 && n_remain > 0 {
            value = (value << 6) + u32::from(src[pos] & 0x3f);
            pos += 1;
            n_remain -= 1;
        }
        if n_remain == 0 {
            out.push(value);
        }
    }
    Partial { value, n_remain }
}

#[derive(Clone)]
struct Cand {
    idx: usize,
    cps: Vec<u32>,
    at: usize,
    partial: Partial,
    id: u32,
}

fn reject_for_stack(g: &Grammar, stack: &Stack, cands: &[Cand]) -> Vec<Cand> {
    let mut rejects = Vec::new();
    let Some(&top) = stack.last() else {
        for t in cands {
            if t.at < t.cps.len() || t.partial.n_remain != 0 {
                rejects.push(t.clone());
            }
        }
        return rejects;
    };
    match elem(g, top) {
        Element::Token(v) | Element::TokenNot(v) => {
            let neg = matches!(elem(g, top), Element::TokenNot(_));
            for t in cands {
                if t.at == t.cps.len() {
                    if t.partial.n_remain != 0 {
                        rejects.push(t.clone());
                    }
                } else if (t.id == v) == neg {
                    rejects.push(t.clone());
                }
            }
            return rejects;
        }
        _ => {}
    }
    let mut next = Vec::new();
    for t in cands {
        if t.at == t.cps.len() {
            if t.partial.n_remain != 0 && !match_partial(g, top, t.partial) {
                rejects.push(t.clone());
            }
        } else if match_char(g, top, t.cps[t.at]).0 {
            let mut n = t.clone();
            n.at += 1;
            next.push(n);
        } else {
            rejects.push(t.clone());
        }
    }
    let after = match_char(g, top, 0).1;
    let mut stack_after: Stack = stack[..stack.len() - 1].to_vec();
    if !elem(g, after).is_end_of_sequence() {
        stack_after.push(after);
    }
    let mut next_stacks = Vec::new();
    advance(g, stack_after, &mut next_stacks);
    for mut t in reject(g, &next_stacks, &next) {
        t.at -= 1;
        rejects.push(t);
    }
    rejects
}

fn reject(g: &Grammar, stacks: &[Stack], cands: &[Cand]) -> Vec<Cand> {
    assert!(!stacks.is_empty());
    if cands.is_empty() {
        return Vec::new();
    }
    let mut rejects = reject_for_stack(g, &stacks[0], cands);
    for s in &stacks[1..] {
        rejects = reject_for_stack(g, s, &rejects);
    }
    rejects
}

impl<'g> Reference<'g> {
    pub fn new(g: &'g Grammar) -> Self {
        let r = g.root as usize;
        let mut stacks = Vec::new();
        let mut sub = 0;
        loop {
            let mut stack = Vec::new();
            if !g.rules[r][sub].is_end_of_sequence() {
                stack.push((r, sub));
            }
            advance(g, stack, &mut stacks);
            while !g.rules[r][sub].is_end_of_sequence() {
                sub += 1;
            }
            if g.rules[r][sub] == Element::Alt {
                sub += 1;
            } else {
                break;
            }
        }
        Reference {
            g,
            stacks,
            partial: Partial::NONE,
        }
    }

    /// `llama_grammar_apply_impl` over the whole vocabulary: allowed[id].
    pub fn allowed(&self, pieces: &[Vec<u8>], is_eog: &dyn Fn(u32) -> bool) -> Vec<bool> {
        let allow_eog = self.stacks.iter().any(|s| s.is_empty());
        let mut allowed = vec![true; pieces.len()];
        let mut cands = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            if is_eog(i as u32) {
                allowed[i] = allow_eog;
            } else if piece.is_empty() || piece[0] == 0 {
                allowed[i] = false;
            } else {
                let (cps, partial) = decode(piece, self.partial);
                cands.push(Cand {
                    idx: i,
                    cps,
                    at: 0,
                    partial,
                    id: i as u32,
                });
            }
        }
        for r in reject(self.g, &self.stacks, &cands) {
            allowed[r.idx] = false;
        }
        allowed
    }

    fn accept_chr(&self, stack: &Stack, c: u32, out: &mut Vec<Stack>) {
        let Some(&top) = stack.last() else { return };
        if matches!(elem(self.g, top), Element::Token(_) | Element::TokenNot(_)) {
            return;
        }
        let (ok, after) = match_char(self.g, top, c);
        if ok {
            let mut ns: Stack = stack[..stack.len() - 1].to_vec();
            if !elem(self.g, after).is_end_of_sequence() {
                ns.push(after);
            }
            advance(self.g, ns, out);
        }
    }

    /// `llama_grammar_accept_token`; false where llama.cpp throws (no stack left).
    pub fn accept(&mut self, id: u32, piece: &[u8]) -> bool {
        let (cps, end) = decode(piece, self.partial);
        let mut new_stacks: Vec<Stack> = Vec::new();
        for stack in &self.stacks {
            let Some(&top) = stack.last() else { continue };
            match elem(self.g, top) {
                Element::Token(v) | Element::TokenNot(v) => {
                    let neg = matches!(elem(self.g, top), Element::TokenNot(_));
                    if (id == v) != neg {
                        let mut ns: Stack = stack[..stack.len() - 1].to_vec();
                        if !elem(self.g, (top.0, top.1 + 1)).is_end_of_sequence() {
                            ns.push((top.0, top.1 + 1));
                        }
                        advance(self.g, ns, &mut new_stacks);
                    }
                }
                _ => {
                    let mut cur = vec![stack.clone()];
                    for &c in &cps {
                        let mut next = Vec::new();
                        for s in &cur {
                            self.accept_chr(s, c, &mut next);
                        }
                        cur = next;
                        if cur.is_empty() {
                            break;
                        }
                    }
                    for s in cur {
                        if !new_stacks.contains(&s) {
                            new_stacks.push(s);
                        }
                    }
                }
            }
        }
        self.stacks = new_stacks;
        self.partial = end;
        !self.stacks.is_empty()
    }

    /// Whether the whole text is in the language (accepted and the grammar may end),
    /// as test-grammar-integration's `match_string` decides it.
    pub fn matches_str(g: &Grammar, text: &str) -> bool {
        let mut r = Reference::new(g);
        let (cps, _) = decode(text.as_bytes(), Partial::NONE);
        for c in cps {
            let mut next = Vec::new();
            for s in &r.stacks {
                r.accept_chr(s, c, &mut next);
            }
            r.stacks = next;
            if r.stacks.is_empty() {
                return false;
            }
        }
        r.stacks.iter().any(|s| s.is_empty())
    }
}

//! llama.cpp's glob (`common/common.cpp` `glob_match`) and the path rule of its
//! `file_glob_search` / `grep_search` tools (`path_glob_match`).
//!
//! Syntax, byte-wise as in llama.cpp: `*` matches any run of bytes but `/`, `**` any run
//! at all, `?` one byte but `/`, `[...]` a class (`[!...]` negated, `a-z` ranges, a
//! leading `]` or `-` literal; an unterminated `[` is a literal `[`), anything else
//! itself.
//!
//! Two differences from llama.cpp, both where its matcher cannot do what the tool
//! descriptions promise:
//! - `**/` at the start of a pattern or right after a `/` also matches zero directories,
//!   so `src/*.cpp`, auto-anchored to `**/src/*.cpp`, finds a top-level `src/a.cpp`, and
//!   `src/**/*.cpp` finds `src/a.cpp` (llama.cpp's recursive matcher needs a literal `/`
//!   there and finds neither);
//! - a pattern anchored with a leading `/` matches the path relative to the search base
//!   (llama.cpp compares it with relative paths, which never start with `/`).
//!
//! Matching is a dynamic program over (pattern token, path byte), `O(pattern × path)`;
//! llama.cpp's backtracking is exponential on patterns like `*a*a*a*a*b`. Patterns
//! longer than [`MAX_PATTERN_LEN`] are refused.

/// The longest include/exclude pattern accepted, in bytes.
pub(crate) const MAX_PATTERN_LEN: usize = 1024;

#[derive(Debug)]
enum Token {
    Byte(u8),
    /// `?`
    Any,
    /// `*`
    Star,
    /// `**` not followed by `/`, or followed by `/` but not at a segment start.
    DoubleStar,
    /// `**/` at the start of the pattern or right after `/`: zero or more directories.
    DirStar,
    /// `[...]`: the bytes between the brackets.
    Class(Vec<u8>),
}

fn tokenize(p: &[u8]) -> Vec<Token> {
    let mut out = Vec::with_capacity(p.len());
    let mut i = 0;
    while i < p.len() {
        let c = p[i];
        if c == b'*' && p.get(i + 1) == Some(&b'*') {
            let at_segment_start = i == 0 || p[i - 1] == b'/';
            if at_segment_start && p.get(i + 2) == Some(&b'/') {
                out.push(Token::DirStar);
                i += 3;
            } else {
                out.push(Token::DoubleStar);
                i += 2;
            }
        } else if c == b'*' {
            out.push(Token::Star);
            i += 1;
        } else if c == b'?' {
            out.push(Token::Any);
            i += 1;
        } else if c == b'[' {
            // llama.cpp: a ']' or '-' right after '[' is literal, then scan to ']'
            let mut end = i + 1;
            if matches!(p.get(end), Some(b']') | Some(b'-')) {
                end += 1;
            }
            while end < p.len() && p[end] != b']' {
                end += 1;
            }
            if end < p.len() {
                out.push(Token::Class(p[i + 1..end].to_vec()));
                i = end + 1;
            } else {
                out.push(Token::Byte(b'['));
                i += 1;
            }
        } else {
            out.push(Token::Byte(c));
            i += 1;
        }
    }
    out
}

/// llama.cpp's `glob_class_match`, over the bytes between `[` and `]`. Ranges compare
/// bytes as C `char`, which is signed on the platforms llama.cpp is built for.
fn class_match(c: u8, class: &[u8]) -> bool {
    let mut s = 0;
    let mut negated = false;
    if class.first() == Some(&b'!') {
        negated = true;
        s = 1;
    }
    if matches!(class.get(s), Some(b']') | Some(b'-')) {
        if class[s] == c {
            return !negated;
        }
        s += 1;
    }
    let mut matched = false;
    while s < class.len() {
        if s + 2 < class.len() && class[s + 1] == b'-' && class[s + 2] != b']' {
            let (lo, hi, ch) = (class[s] as i8, class[s + 2] as i8, c as i8);
            if ch >= lo && ch <= hi {
                matched = true;
                break;
            }
            s += 3;
        } else {
            if class[s] == c {
                matched = true;
                break;
            }
            s += 1;
        }
    }
    matched != negated
}

/// Whether `pattern` matches all of `s`.
pub(crate) fn glob_match(pattern: &str, s: &str) -> bool {
    let tokens = tokenize(pattern.as_bytes());
    let s = s.as_bytes();
    let n = s.len();
    // next[j]: tokens[i + 1..] match s[j..]
    let mut next = vec![false; n + 1];
    next[n] = true;
    let mut cur = vec![false; n + 1];
    for token in tokens.iter().rev() {
        match token {
            Token::Byte(b) => {
                for j in 0..=n {
                    cur[j] = j < n && s[j] == *b && next[j + 1];
                }
            }
            Token::Any => {
                for j in 0..=n {
                    cur[j] = j < n && s[j] != b'/' && next[j + 1];
                }
            }
            Token::Class(class) => {
                for j in 0..=n {
                    cur[j] = j < n && class_match(s[j], class) && next[j + 1];
                }
            }
            Token::Star => {
                cur[n] = next[n];
                for j in (0..n).rev() {
                    cur[j] = next[j] || (s[j] != b'/' && cur[j + 1]);
                }
            }
            Token::DoubleStar => {
                cur[n] = next[n];
                for j in (0..n).rev() {
                    cur[j] = next[j] || cur[j + 1];
                }
            }
            Token::DirStar => {
                // "" or anything ending in '/'
                let mut slash_then_rest = false;
                cur[n] = next[n];
                for j in (0..n).rev() {
                    slash_then_rest = slash_then_rest || (s[j] == b'/' && next[j + 1]);
                    cur[j] = next[j] || slash_then_rest;
                }
            }
        }
        std::mem::swap(&mut cur, &mut next);
    }
    next[0]
}

/// The rule of llama.cpp's `path_glob_match`: a pattern without `/` matches the file name
/// at any depth, one with `/` the whole relative path, auto-anchored with `**/` unless it
/// starts with `**/` or `/` (see the module doc for the leading `/`).
pub(crate) fn path_glob_match(pattern: &str, rel_path: &str) -> bool {
    if !pattern.contains('/') {
        let name = rel_path.rsplit('/').next().unwrap_or(rel_path);
        return glob_match(pattern, name);
    }
    if let Some(anchored) = pattern.strip_prefix('/') {
        return glob_match(anchored, rel_path);
    }
    if pattern == "**" || pattern.starts_with("**/") {
        return glob_match(pattern, rel_path);
    }
    glob_match(&format!("**/{pattern}"), rel_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basics() {
        assert!(glob_match("*.cpp", "main.cpp"));
        assert!(!glob_match("*.cpp", "src/main.cpp"));
        assert!(glob_match("**.cpp", "src/main.cpp"));
        assert!(glob_match("**", ""));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "a/c"));
        assert!(glob_match("[a-c]x", "bx"));
        assert!(!glob_match("[!a-c]x", "bx"));
        assert!(glob_match("[]]", "]"));
        assert!(glob_match("[-a]", "-"));
        assert!(glob_match("a[b", "a[b"));
        assert!(glob_match("*proj*", "project-alpha"));
        assert!(glob_match("**/src/*.cpp", "a/src/x.cpp"));
        assert!(glob_match("**/src/*.cpp", "src/x.cpp"));
        assert!(glob_match("src/**/*.cpp", "src/x.cpp"));
        assert!(glob_match("src/**/*.cpp", "src/a/b/x.cpp"));
        assert!(!glob_match("src/**/*.cpp", "srcx.cpp"));
        assert!(glob_match("a**b", "a/x/b"));
    }

    #[test]
    fn no_exponential_blowup() {
        let p = "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b";
        let s = "a".repeat(200);
        assert!(!glob_match(p, &s));
        let p = "**a**a**a**a**a**a**a**a**a**a**a**a**b";
        assert!(!glob_match(p, &s));
    }

    #[test]
    fn path_rule() {
        assert!(path_glob_match(
            "test_tools_builtin.py",
            "tools/server/tests/unit/test_tools_builtin.py"
        ));
        assert!(path_glob_match("**", "a/b"));
        assert!(path_glob_match("src/*.cpp", "src/main.cpp"));
        assert!(path_glob_match("src/*.cpp", "x/src/main.cpp"));
        assert!(!path_glob_match("src/*.cpp", "src/a/main.cpp"));
        assert!(path_glob_match("/src/*.cpp", "src/main.cpp"));
        assert!(!path_glob_match("/src/*.cpp", "x/src/main.cpp"));
        assert!(path_glob_match("**/*.txt", "a.txt"));
    }
}

//! The runtime of a grammar: llama.cpp's pushdown stacks (`llama_grammar_stacks`),
//! advanced one code point at a time exactly as `llama_grammar_accept_chr` and
//! `llama_grammar_advance_stack` do, and the token checks of
//! `llama_grammar_apply_impl` / `llama_grammar_accept_impl`.
//!
//! Why it is fast where llama.cpp's is slow: stacks are hash-consed (a stack is an id;
//! popping is a parent link), a *set* of stacks is an id too, and the step
//! `set × code point → set` is memoized. A token mask is then one preorder walk of the
//! vocabulary trie ([`crate::TokenIndex`]) with one table lookup per trie edge, and
//! masks are cached per set, so a string or number being generated costs a lookup
//! after the first token.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

use crate::gbnf::{Element, Grammar};
use crate::utf8::{Partial, decode_utf8};
use crate::vocab::TokenIndex;

/// FxHash: the keys are small integers, so SipHash's cost buys nothing here.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
        for &b in chunks.remainder() {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Why a token could not be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatchError {
    #[error("token {0} is outside the vocabulary")]
    UnknownToken(u32),
    #[error("the grammar does not allow token {token} ({text:?}) here")]
    Rejected { token: u32, text: String },
    #[error("the grammar does not allow ending here")]
    EndNotAllowed,
    #[error("the grammar cannot be compiled: {0}")]
    Compile(String),
    /// The text so far has more parses than the matcher follows: nested repetitions
    /// such as `((x)+)+` or `(x | x)+` have exponentially many.
    #[error("grammar too ambiguous: more than {0} parse stacks")]
    TooManyStacks(usize),
    /// One call (a token) took more stack steps than [`MAX_WORK`], or the generation
    /// since the start more than [`MAX_TOTAL_WORK`] (the number is the limit hit).
    #[error("grammar too ambiguous: more than {0} parse-stack steps")]
    TooMuchWork(u64),
}

/// The most parse stacks one set may hold: well above what real grammars reach (a
/// JSON schema's grammar has tens), far below what makes one step take seconds.
pub const MAX_STACKS: usize = 1 << 14;
/// The most stack steps (`advance` visits) one call of [`Matcher`] may take.
pub const MAX_WORK: u64 = 1 << 22;
/// The most stack steps a matcher may take from its start (or [`Matcher::reset`]), so
/// that a grammar just under [`MAX_WORK`] per token cannot hold a generation for long.
/// Real grammars take tens to thousands per token, most tokens none (memoized).
pub const MAX_TOTAL_WORK: u64 = 1 << 26;

/// A character class as llama.cpp walks it from its first element.
#[derive(Clone, Debug)]
struct Class {
    positive: bool,
    any: bool,
    /// Inclusive ranges (a single char is `(c, c)`), in grammar order.
    items: Box<[(u32, u32)]>,
    /// Element index after the class.
    end: u32,
}

impl Class {
    fn matches(&self, c: u32) -> bool {
        let found = self.any || self.items.iter().any(|&(lo, hi)| lo <= c && c <= hi);
        found == self.positive
    }

    /// `llama_grammar_match_partial_char`.
    fn matches_partial(&self, p: Partial) -> bool {
        let n = p.n_remain;
        if n < 0 || (n == 1 && p.value < 2) {
            return false;
        }
        let mut low = p.value << (n * 6);
        let high = low | ((1u32 << (n * 6)) - 1);
        if low == 0 {
            if n == 2 {
                low = 1 << 11;
            } else if n == 3 {
                low = 1 << 16;
            }
        }
        if self.any {
            return true;
        }
        for &(lo, hi) in self.items.iter() {
            if lo <= high && low <= hi {
                return self.positive;
            }
        }
        !self.positive
    }
}

/// The grammar flattened for the runtime.
#[derive(Clone, Debug)]
struct Program {
    elems: Vec<Element>,
    /// Start index of each alternative of each rule.
    alts: Vec<Box<[u32]>>,
    /// For element indices that start a character class, its index into `classes`.
    class_at: Vec<u32>,
    classes: Vec<Class>,
    /// Every code point where some class starts or stops matching, sorted: the code
    /// points between two boundaries are alike to every class of the grammar, so a
    /// step depends only on the interval (`interval_of`).
    boundaries: Vec<u32>,
}

const NO_CLASS: u32 = u32::MAX;

impl Program {
    fn new(g: &Grammar) -> Program {
        let mut elems = Vec::new();
        let mut alts = Vec::with_capacity(g.rules.len());
        for rule in &g.rules {
            let base = elems.len() as u32;
            let mut starts = vec![base];
            for (i, e) in rule.iter().enumerate() {
                if *e == Element::Alt {
                    starts.push(base + i as u32 + 1);
                }
            }
            alts.push(starts.into_boxed_slice());
            elems.extend_from_slice(rule);
        }
        let mut class_at = vec![NO_CLASS; elems.len()];
        let mut classes = Vec::new();
        for i in 0..elems.len() {
            let (positive, any, first) = match elems[i] {
                Element::Char(c) => (true, false, Some(c)),
                Element::CharNot(c) => (false, false, Some(c)),
                Element::CharAny => (true, true, None),
                _ => continue,
            };
            let mut items = Vec::new();
            let mut j = i + 1;
            if let Some(c) = first {
                if let Some(Element::CharRngUpper(hi)) = elems.get(j) {
                    items.push((c, *hi));
                    j += 1;
                } else {
                    items.push((c, c));
                }
            }
            while let Some(Element::CharAlt(c)) = elems.get(j) {
                let c = *c;
                j += 1;
                if let Some(Element::CharRngUpper(hi)) = elems.get(j) {
                    items.push((c, *hi));
                    j += 1;
                } else {
                    items.push((c, c));
                }
            }
            class_at[i] = classes.len() as u32;
            classes.push(Class {
                positive,
                any,
                items: items.into_boxed_slice(),
                end: j as u32,
            });
        }
        let mut boundaries: Vec<u32> = classes
            .iter()
            .flat_map(|c| c.items.iter())
            .flat_map(|&(lo, hi)| [lo, hi.saturating_add(1)])
            .collect();
        boundaries.sort_unstable();
        boundaries.dedup();
        Program {
            elems,
            alts,
            class_at,
            classes,
            boundaries,
        }
    }

    fn n_intervals(&self) -> usize {
        self.boundaries.len() + 1
    }

    fn interval_of(&self, c: u32) -> u32 {
        self.boundaries.partition_point(|&b| b <= c) as u32
    }

    /// A code point of interval `i`.
    fn representative(&self, i: u32) -> u32 {
        if i == 0 {
            0
        } else {
            self.boundaries[i as usize - 1]
        }
    }

    fn is_end(&self, pos: u32) -> bool {
        self.elems
            .get(pos as usize)
            .is_none_or(|e| e.is_end_of_sequence())
    }
}

/// Stack id 0 is the empty stack; set id 0 the empty (dead) set.
const EMPTY_STACK: u32 = 0;
/// Stands for "the rest of a stack, unknown": the bottom of a truncated stack.
const TRUNC: u32 = 1;
const DEAD: u32 = 0;
const UNKNOWN: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct StackSet {
    stacks: Box<[u32]>,
    /// Stacks whose top is a character class.
    char_stacks: Box<[u32]>,
    /// Stacks whose top is `<[id]>` / `!<[id]>`: (negated, id).
    token_tops: Box<[(bool, u32)]>,
    has_empty: bool,
    /// Some stack popped into the unknown rest of a truncated stack.
    has_trunc: bool,
}

/// Interned stacks and stack sets with their memoized transitions.
#[derive(Clone, Debug)]
struct Machine {
    prog: Program,
    /// (top element, rest of the stack) per stack id.
    nodes: Vec<(u32, u32)>,
    node_ids: FxMap<(u32, u32), u32>,
    sets: Vec<StackSet>,
    set_ids: FxMap<Box<[u32]>, u32>,
    /// Memoized steps: `trans[set * n_intervals + interval]`.
    trans: Vec<u32>,
    n_intervals: usize,
    /// Steps by which of the set's character stacks match (`(set, bitmask)`): code
    /// points no class tells apart share one entry, so a new code point costs a few
    /// class tests rather than a new stack set.
    by_matches: FxMap<(u32, u64), u32>,
    /// Per set: some stack waits for a token.
    has_tokens: Vec<bool>,
    // Scratch for `advance`.
    todo: Vec<u32>,
    seen: FxMap<u32, ()>,
    /// The stacks already in the `out` being built (cleared with [`Machine::new_out`]).
    in_out: FxMap<u32, ()>,
    /// Stack steps taken in the current call; past [`MAX_WORK`] (or a set past
    /// [`MAX_STACKS`]) the machine stops: `overflow` says why, every step is dead and
    /// nothing computed since is cached, until [`Matcher::reset`].
    work: u64,
    /// Stack steps since the start or the last reset, against [`MAX_TOTAL_WORK`].
    total_work: u64,
    overflow: Option<MatchError>,
}

impl Machine {
    fn new(prog: Program) -> Machine {
        let n_intervals = prog.n_intervals();
        let mut m = Machine {
            prog,
            nodes: vec![(u32::MAX, u32::MAX), (u32::MAX, u32::MAX)],
            node_ids: FxMap::default(),
            sets: Vec::new(),
            set_ids: FxMap::default(),
            trans: Vec::new(),
            n_intervals: 0,
            by_matches: FxMap::default(),
            has_tokens: Vec::new(),
            todo: Vec::new(),
            seen: FxMap::default(),
            in_out: FxMap::default(),
            work: 0,
            total_work: 0,
            overflow: None,
        };
        m.n_intervals = n_intervals;
        m.intern_set(Vec::new());
        m
    }

    fn push(&mut self, parent: u32, pos: u32) -> u32 {
        let next = self.nodes.len() as u32;
        let id = *self.node_ids.entry((pos, parent)).or_insert(next);
        if id == next {
            self.nodes.push((pos, parent));
        }
        id
    }

    fn pop(&self, stack: u32) -> (u32, u32) {
        self.nodes[stack as usize]
    }

    /// Starts a new `out` for [`Machine::advance`].
    fn new_out(&mut self) -> Vec<u32> {
        self.in_out.clear();
        Vec::new()
    }

    /// `llama_grammar_advance_stack`: every stack `stack` can become with a terminal
    /// (or nothing) on top, added to `out` (begun by [`Machine::new_out`]) without
    /// duplicates.
    fn advance(&mut self, stack: u32, out: &mut Vec<u32>) {
        self.todo.clear();
        self.seen.clear();
        self.todo.push(stack);
        while let Some(s) = self.todo.pop() {
            if self.seen.insert(s, ()).is_some() {
                continue;
            }
            self.work += 1;
            self.total_work += 1;
            if self.work > MAX_WORK {
                self.overflow = Some(MatchError::TooMuchWork(MAX_WORK));
                return;
            }
            if self.total_work > MAX_TOTAL_WORK {
                self.overflow = Some(MatchError::TooMuchWork(MAX_TOTAL_WORK));
                return;
            }
            if s == EMPTY_STACK || s == TRUNC {
                if self.in_out.insert(s, ()).is_none() {
                    if out.len() >= MAX_STACKS {
                        self.overflow = Some(MatchError::TooManyStacks(MAX_STACKS));
                        return;
                    }
                    out.push(s);
                }
                continue;
            }
            let (pos, parent) = self.pop(s);
            match self.prog.elems[pos as usize] {
                Element::RuleRef(r) => {
                    let after = pos + 1;
                    let base = if self.prog.is_end(after) {
                        parent
                    } else {
                        self.push(parent, after)
                    };
                    let n_alts = self.prog.alts[r as usize].len();
                    for a in 0..n_alts {
                        let sub = self.prog.alts[r as usize][a];
                        let next = if self.prog.is_end(sub) {
                            base
                        } else {
                            self.push(base, sub)
                        };
                        self.todo.push(next);
                    }
                }
                Element::Char(_)
                | Element::CharNot(_)
                | Element::CharAny
                | Element::Token(_)
                | Element::TokenNot(_) => {
                    if self.in_out.insert(s, ()).is_none() {
                        if out.len() >= MAX_STACKS {
                            self.overflow = Some(MatchError::TooManyStacks(MAX_STACKS));
                            return;
                        }
                        out.push(s);
                    }
                }
                // The parser never leaves a stack on these.
                Element::End | Element::Alt | Element::CharAlt(_) | Element::CharRngUpper(_) => {}
            }
        }
    }

    /// The stacks of the start rule's alternatives (`llama_grammar_init_impl`).
    fn start(&mut self, root: u32) -> u32 {
        let mut out = self.new_out();
        let n_alts = self.prog.alts[root as usize].len();
        for a in 0..n_alts {
            let sub = self.prog.alts[root as usize][a];
            let stack = if self.prog.is_end(sub) {
                EMPTY_STACK
            } else {
                self.push(EMPTY_STACK, sub)
            };
            self.advance(stack, &mut out);
        }
        self.intern_set(out)
    }

    fn intern_set(&mut self, mut stacks: Vec<u32>) -> u32 {
        stacks.sort_unstable();
        stacks.dedup();
        if let Some(&id) = self.set_ids.get(stacks.as_slice()) {
            return id;
        }
        let mut char_stacks = Vec::new();
        let mut token_tops = Vec::new();
        let mut has_empty = false;
        let mut has_trunc = false;
        for &s in &stacks {
            if s == EMPTY_STACK {
                has_empty = true;
                continue;
            }
            if s == TRUNC {
                has_trunc = true;
                continue;
            }
            match self.prog.elems[self.pop(s).0 as usize] {
                Element::Token(t) => token_tops.push((false, t)),
                Element::TokenNot(t) => token_tops.push((true, t)),
                _ => char_stacks.push(s),
            }
        }
        let id = self.sets.len() as u32;
        let key: Box<[u32]> = stacks.into_boxed_slice();
        self.sets.push(StackSet {
            stacks: key.clone(),
            char_stacks: char_stacks.into_boxed_slice(),
            token_tops: token_tops.into_boxed_slice(),
            has_empty,
            has_trunc,
        });
        self.trans
            .resize(self.trans.len() + self.n_intervals, UNKNOWN);
        self.has_tokens
            .push(!self.sets[id as usize].token_tops.is_empty());
        self.set_ids.insert(key, id);
        id
    }

    /// `llama_grammar_accept` for one code point, memoized.
    #[inline]
    fn step(&mut self, set: u32, c: u32) -> u32 {
        let i = self.prog.interval_of(c);
        self.step_interval(set, i)
    }

    /// The step for every code point of interval `i`.
    #[inline]
    fn step_interval(&mut self, set: u32, i: u32) -> u32 {
        let at = set as usize * self.n_intervals + i as usize;
        let cached = self.trans[at];
        if cached != UNKNOWN {
            return cached;
        }
        let next = self.compute_step(set, self.prog.representative(i));
        if self.overflow.is_none() {
            self.trans[at] = next;
        }
        next
    }

    fn compute_step(&mut self, set: u32, c: u32) -> u32 {
        if set == DEAD || self.overflow.is_some() {
            return DEAD;
        }
        let n = self.sets[set as usize].char_stacks.len();
        let mut matched: u64 = 0;
        if n <= 64 {
            for k in 0..n {
                let s = self.sets[set as usize].char_stacks[k];
                let pos = self.pop(s).0;
                if self.prog.classes[self.prog.class_at[pos as usize] as usize].matches(c) {
                    matched |= 1 << k;
                }
            }
            if matched == 0 {
                return DEAD;
            }
            if let Some(&next) = self.by_matches.get(&(set, matched)) {
                return next;
            }
        }
        let mut out = self.new_out();
        for k in 0..n {
            let s = self.sets[set as usize].char_stacks[k];
            let (pos, parent) = self.pop(s);
            let class = &self.prog.classes[self.prog.class_at[pos as usize] as usize];
            if !class.matches(c) {
                continue;
            }
            let end = class.end;
            let next = if self.prog.is_end(end) {
                parent
            } else {
                self.push(parent, end)
            };
            self.advance(next, &mut out);
            if self.overflow.is_some() {
                return DEAD;
            }
        }
        let next = self.intern_set(out);
        if n <= 64 {
            self.by_matches.insert((set, matched), next);
        }
        next
    }

    /// `stack` cut to its top `depth` frames over [`TRUNC`] (itself if no deeper).
    fn truncate(&mut self, stack: u32, depth: usize) -> u32 {
        let mut frames = Vec::with_capacity(depth);
        let mut s = stack;
        while s != EMPTY_STACK && s != TRUNC && frames.len() < depth {
            let (pos, parent) = self.pop(s);
            frames.push(pos);
            s = parent;
        }
        if s == EMPTY_STACK || s == TRUNC {
            return stack;
        }
        frames
            .iter()
            .rev()
            .fold(TRUNC, |base, &pos| self.push(base, pos))
    }

    /// `set` with every stack truncated to `depth` frames.
    fn truncate_set(&mut self, set: u32, depth: usize) -> u32 {
        let stacks = self.sets[set as usize].stacks.to_vec();
        let cut: Vec<u32> = stacks.iter().map(|&s| self.truncate(s, depth)).collect();
        self.intern_set(cut)
    }

    /// Some stack of `set` has a class that a completion of `p` could satisfy.
    fn partial_ok(&self, set: u32, p: Partial) -> bool {
        self.sets[set as usize].char_stacks.iter().any(|&s| {
            let pos = self.pop(s).0;
            self.prog.classes[self.prog.class_at[pos as usize] as usize].matches_partial(p)
        })
    }
}

/// Matches a generation against a grammar, token by token: which tokens may come next
/// ([`Matcher::fill_mask`], [`Matcher::is_allowed`]) and the state after one
/// ([`Matcher::accept`]). Cheap to create from a shared [`TokenIndex`].
#[derive(Clone, Debug)]
pub struct Matcher {
    m: Machine,
    vocab: Arc<TokenIndex>,
    cur: u32,
    partial: Partial,
    root: u32,
    scratch: Vec<u32>,
    set_path: Vec<u32>,
    masks: FxMap<u32, Box<[u64]>>,
    /// Masks of truncated stack sets with the trie nodes they left undecided.
    tmasks: FxMap<u32, Arc<TruncatedMask>>,
    /// Hash of the grammar's elements: with a truncated set's stacks (as element
    /// positions), the key of masks shared through the vocabulary across matchers.
    program_hash: u64,
    /// The interval of each trie node's code point.
    alpha_interval: Arc<[u32]>,
    trunc_depth: usize,
    node_path: Vec<u32>,
}

/// The mask of a truncated stack set and what it left undecided.
#[derive(Debug)]
pub(crate) struct TruncatedMask {
    mask: Box<[u64]>,
    undecided: Undecided,
}

/// A truncated set by content: the grammar (hash of its elements) and its stacks.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SharedKey {
    program: u64,
    stacks: Box<[u32]>,
}

/// Truncated masks shared by every matcher of a vocabulary: requests with the same
/// schema reuse each other's work. Bounded; the oldest entries go first.
#[derive(Debug, Default)]
pub(crate) struct SharedMasks {
    inner: std::sync::Mutex<SharedMap>,
}

/// The shared masks and their insertion order (oldest first).
type SharedMap = (
    FxMap<SharedKey, Arc<TruncatedMask>>,
    std::collections::VecDeque<SharedKey>,
);

/// Shared truncated masks kept per vocabulary (a Gemma 3 entry is about 150 KiB).
const SHARED_MASKS: usize = 64;

impl SharedMasks {
    pub(crate) fn clear(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0.clear();
        g.1.clear();
    }

    fn get(&self, key: &SharedKey) -> Option<Arc<TruncatedMask>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0.get(key).cloned()
    }

    fn insert(&self, key: SharedKey, value: Arc<TruncatedMask>) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *g;
        if map.insert(key.clone(), value).is_none() {
            order.push_back(key);
            while order.len() > SHARED_MASKS {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
        }
    }
}

/// What a walk over truncated stacks could not decide, as bitsets over trie nodes:
/// `open` nodes, where a stack reached the unknown rest (their whole subtree must be
/// walked with the real stacks), and `path`, those nodes and their ancestors.
#[derive(Clone, Debug, Default)]
struct Undecided {
    open: Box<[u64]>,
    path: Box<[u64]>,
}

fn bit(bits: &[u64], n: usize) -> bool {
    bits[n / 64] >> (n % 64) & 1 == 1
}

/// Masks kept per matcher (a Gemma 3 mask is 32 KiB).
const MASK_CACHE: usize = 64;
/// Stack frames a mask is computed over before the rest is treated as unknown: masks
/// of the top frames (a string's body, a number) are shared by every context they
/// occur in, and only the tokens that reach below are walked again with the real
/// stacks.
const TRUNC_DEPTH: usize = 3;
/// When the interned state outgrows this, it is rebuilt around the current stacks.
const MAX_NODES: usize = 1 << 21;
/// Likewise for the step table (entries).
const MAX_TRANS: usize = 1 << 25;

impl Matcher {
    pub fn new(grammar: &Grammar, vocab: Arc<TokenIndex>) -> Matcher {
        let mut m = Machine::new(Program::new(grammar));
        let program_hash = {
            let mut h = FxHasher::default();
            m.prog.elems.hash(&mut h);
            h.finish()
        };
        let cur = m.start(grammar.root);
        Matcher {
            m,
            vocab,
            cur,
            partial: Partial::NONE,
            root: grammar.root,
            scratch: Vec::new(),
            set_path: Vec::new(),
            masks: FxMap::default(),
            tmasks: FxMap::default(),
            program_hash,
            alpha_interval: Arc::from(Vec::new()),
            trunc_depth: TRUNC_DEPTH,
            node_path: Vec::new(),
        }
    }

    /// [`Matcher::new`], refusing a grammar whose start already has more parse stacks
    /// than the matcher follows ([`MAX_STACKS`]).
    pub fn try_new(grammar: &Grammar, vocab: Arc<TokenIndex>) -> Result<Matcher, MatchError> {
        let m = Matcher::new(grammar, vocab);
        match &m.m.overflow {
            Some(e) => Err(e.clone()),
            None => Ok(m),
        }
    }

    pub fn vocab(&self) -> &Arc<TokenIndex> {
        &self.vocab
    }

    /// The start of a call: an earlier overflow stays an error until [`Matcher::reset`];
    /// otherwise the call gets a fresh [`MAX_WORK`] budget.
    fn begin(&mut self) -> Result<(), MatchError> {
        if let Some(e) = &self.m.overflow {
            return Err(e.clone());
        }
        self.m.work = 0;
        Ok(())
    }

    /// Why the matcher stopped (too many stacks or steps), if it did: then every mask and
    /// token is refused until [`Matcher::reset`].
    pub fn overflow(&self) -> Option<&MatchError> {
        self.m.overflow.as_ref()
    }

    /// How many stack frames masks are computed over before the rest counts as
    /// unknown (see `TRUNC_DEPTH`); for tests, which check that every depth gives the
    /// same masks.
    #[doc(hidden)]
    pub fn set_trunc_depth(&mut self, depth: usize) {
        self.trunc_depth = depth.max(1);
        self.masks.clear();
        self.tmasks.clear();
    }

    /// Forgets the cached masks and memoized transitions (they are rebuilt on demand);
    /// the state is kept. For measuring the uncached cost.
    pub fn clear_caches(&mut self) {
        self.compact();
    }

    /// Back to the start of the grammar.
    pub fn reset(&mut self) {
        // Nothing computed during an overflow was kept, so the interned state is sound.
        self.m.overflow = None;
        self.m.work = 0;
        self.m.total_work = 0;
        self.cur = self.m.start(self.root);
        self.partial = Partial::NONE;
    }

    /// The grammar may end here (an end-of-generation token is allowed).
    pub fn is_accepting(&self) -> bool {
        self.m.sets[self.cur as usize].has_empty
    }

    /// Nothing but the end may follow.
    pub fn is_finished(&self) -> bool {
        let s = &self.m.sets[self.cur as usize];
        s.has_empty && s.stacks.len() == 1
    }

    /// Whether token `id` may come next (llama.cpp's grammar sampler applied to that
    /// one candidate). False once the matcher has overflowed ([`Matcher::overflow`]).
    pub fn is_allowed(&mut self, id: u32) -> bool {
        if self.begin().is_err() {
            return false;
        }
        let ok = self.is_allowed_inner(id);
        ok && self.m.overflow.is_none()
    }

    fn is_allowed_inner(&mut self, id: u32) -> bool {
        let Some(piece) = self.vocab.pieces.get(id as usize) else {
            return false;
        };
        if self.vocab.is_eog[id as usize] {
            return self.is_accepting();
        }
        if piece.is_empty() {
            return false;
        }
        let mut cps = std::mem::take(&mut self.scratch);
        let end = decode_utf8(piece, self.partial, &mut cps);
        let ok = self.check_code_points(id, &cps, end);
        self.scratch = cps;
        ok
    }

    fn check_code_points(&mut self, id: u32, cps: &[u32], end: Partial) -> bool {
        let mut set = self.cur;
        for &c in cps {
            if self.m.sets[set as usize]
                .token_tops
                .iter()
                .any(|&(neg, t)| (t == id) != neg)
            {
                return true;
            }
            set = self.m.step(set, c);
            if set == DEAD {
                return false;
            }
        }
        match end.n_remain {
            0 => true,
            n if n > 0 => self.m.partial_ok(set, end),
            _ => false,
        }
    }

    /// Sets bit `id` of `mask` (`mask[id / 64] >> (id % 64) & 1`) for every token the
    /// grammar allows next and clears the others. `mask` has `ceil(n_vocab / 64)` words.
    /// Fails (with `mask` all clear) when the grammar is too ambiguous here
    /// ([`MatchError::TooManyStacks`], [`MatchError::TooMuchWork`]).
    pub fn fill_mask(&mut self, mask: &mut [u64]) -> Result<(), MatchError> {
        if let Err(e) = self.begin() {
            mask.fill(0);
            return Err(e);
        }
        self.fill_mask_inner(mask);
        match &self.m.overflow {
            Some(e) => {
                mask.fill(0);
                Err(e.clone())
            }
            None => Ok(()),
        }
    }

    fn fill_mask_inner(&mut self, mask: &mut [u64]) {
        if self.partial.n_remain > 0 {
            // After a token that ended inside a UTF-8 sequence every token decodes
            // differently; check them one by one (rare: byte-fallback output).
            mask.fill(0);
            for id in 0..self.vocab.n_vocab as u32 {
                if self.m.overflow.is_some() {
                    return;
                }
                if self.is_allowed_inner(id) {
                    mask[id as usize / 64] |= 1 << (id % 64);
                }
            }
            return;
        }
        if let Some(m) = self.masks.get(&self.cur) {
            mask.copy_from_slice(m);
            return;
        }
        let cur = self.cur;
        // A set no deeper than the cut is its own truncation: its walk decides
        // everything, and is shared all the same.
        let cut = self.m.truncate_set(cur, self.trunc_depth);
        let t = match self.tmasks.get(&cut) {
            Some(t) => Arc::clone(t),
            None => {
                let key = self.shared_key(cut);
                let t = match self.vocab.shared_masks.get(&key) {
                    Some(t) => t,
                    None => {
                        mask.fill(0);
                        let undecided = self.walk(cut, mask);
                        if self.m.overflow.is_some() {
                            return;
                        }
                        let t = Arc::new(TruncatedMask {
                            mask: mask.to_vec().into_boxed_slice(),
                            undecided,
                        });
                        self.vocab.shared_masks.insert(key, Arc::clone(&t));
                        t
                    }
                };
                if self.tmasks.len() >= MASK_CACHE {
                    self.tmasks.clear();
                }
                self.tmasks.insert(cut, Arc::clone(&t));
                t
            }
        };
        mask.copy_from_slice(&t.mask);
        self.walk_undecided(cur, mask, &t.undecided);
        if self.m.overflow.is_some() {
            return;
        }
        if self.m.sets[cur as usize].has_empty {
            for &e in &self.vocab.eog {
                mask[e as usize / 64] |= 1 << (e % 64);
            }
        }
        if self.masks.len() >= MASK_CACHE {
            self.masks.clear();
        }
        self.masks.insert(cur, mask.to_vec().into_boxed_slice());
    }

    /// The grammar and the truncated set's stacks by content (ids differ between
    /// matchers; positions in the same grammar do not).
    fn shared_key(&self, set: u32) -> SharedKey {
        let mut stacks: Vec<Vec<u32>> = self.m.sets[set as usize]
            .stacks
            .iter()
            .map(|&s| {
                let mut frames = Vec::new();
                let mut s = s;
                while s != EMPTY_STACK && s != TRUNC {
                    let (pos, parent) = self.m.pop(s);
                    frames.push(pos);
                    s = parent;
                }
                frames.push(if s == TRUNC { u32::MAX - 1 } else { u32::MAX });
                frames
            })
            .collect();
        stacks.sort_unstable();
        SharedKey {
            program: self.program_hash,
            stacks: stacks.concat().into_boxed_slice(),
        }
    }

    /// Walks, with the real stacks, the trie nodes a truncated walk left undecided
    /// (the subtrees of `open` nodes, and the paths to them), adding the tokens they
    /// allow.
    fn walk_undecided(&mut self, root: u32, mask: &mut [u64], undecided: &Undecided) {
        let v = Arc::clone(&self.vocab);
        if !bit(&undecided.path, 0) {
            return;
        }
        self.ensure_intervals(&v);
        let Matcher {
            m,
            set_path,
            alpha_interval,
            ..
        } = self;
        set_path.clear();
        set_path.resize(v.max_depth + 1, DEAD);
        set_path[0] = root;
        Self::visit(m, &v, 0, root, mask);
        let n = v.node_cp.len();
        // Inside an open subtree every node is walked.
        let mut open_until = if bit(&undecided.open, 0) { n } else { 0 };
        let mut i = 1;
        while i < n {
            if i >= open_until {
                if !bit(&undecided.path, i) {
                    i = v.node_end[i] as usize;
                    continue;
                }
                if bit(&undecided.open, i) {
                    open_until = v.node_end[i] as usize;
                }
            }
            let d = v.node_depth[i] as usize;
            let s = m.step_interval(set_path[d - 1], alpha_interval[i]);
            if s == DEAD {
                i = v.node_end[i] as usize;
                continue;
            }
            set_path[d] = s;
            Self::visit(m, &v, i, s, mask);
            i += 1;
        }
    }

    /// The interval of every trie node's code point (computed once per matcher).
    /// Shared through the vocabulary for grammars with the same class boundaries (every
    /// request with the same schema): for a large vocabulary it costs about a
    /// millisecond.
    fn ensure_intervals(&mut self, v: &TokenIndex) {
        if self.alpha_interval.len() == v.node_alpha.len() {
            return;
        }
        let boundaries = &self.m.prog.boundaries;
        {
            let cached = v.intervals.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((b, iv)) = cached.as_ref()
                && b == boundaries
            {
                self.alpha_interval = Arc::clone(iv);
                return;
            }
        }
        let by_alpha: Vec<u32> = v
            .alphabet
            .iter()
            .map(|&c| self.m.prog.interval_of(c))
            .collect();
        let iv: Arc<[u32]> = v
            .node_alpha
            .iter()
            .map(|&a| by_alpha.get(a as usize).copied().unwrap_or(0))
            .collect();
        *v.intervals.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((boundaries.clone(), Arc::clone(&iv)));
        self.alpha_interval = iv;
    }

    /// The mask of stack set `root` (possibly truncated) over the whole trie, and the
    /// nodes where a stack reached the unknown rest, with their ancestors, for
    /// [`Matcher::walk_undecided`].
    fn walk(&mut self, root: u32, mask: &mut [u64]) -> Undecided {
        let v = Arc::clone(&self.vocab);
        let words = v.n_nodes().div_ceil(64);
        let (mut open, mut path) = (vec![0u64; words], vec![0u64; words]);
        if root == DEAD {
            return Undecided {
                open: open.into_boxed_slice(),
                path: path.into_boxed_slice(),
            };
        }
        self.ensure_intervals(&v);
        let Matcher {
            m,
            set_path,
            alpha_interval,
            node_path,
            ..
        } = self;
        set_path.clear();
        set_path.resize(v.max_depth + 1, DEAD);
        set_path[0] = root;
        node_path.clear();
        node_path.resize(v.max_depth + 1, 0);
        if m.sets[root as usize].has_trunc {
            open[0] |= 1;
            path[0] |= 1;
        }
        // The hot loop: one step-table lookup per trie node, locals for every array.
        let (depth, end) = (&v.node_depth[..], &v.node_end[..]);
        let (tok, mid) = (&v.node_tok[..], &v.node_mid[..]);
        let (sorted, partial) = (&v.sorted[..], &v.sorted_partial[..]);
        Self::visit(m, &v, 0, root, mask);
        let n = v.node_cp.len();
        let mut i = 1;
        while i < n {
            let d = depth[i] as usize;
            let parent = set_path[d - 1];
            let iv = alpha_interval[i];
            let mut s = m.trans[parent as usize * m.n_intervals + iv as usize];
            if s == UNKNOWN {
                s = m.step_interval(parent, iv);
            }
            if s == DEAD {
                i = end[i] as usize;
                continue;
            }
            set_path[d] = s;
            node_path[d] = i as u32;
            if m.sets[s as usize].has_trunc {
                open[i / 64] |= 1 << (i % 64);
                for &a in node_path[..=d].iter().rev() {
                    let (w, b) = (a as usize / 64, a % 64);
                    if path[w] >> b & 1 == 1 {
                        break;
                    }
                    path[w] |= 1 << b;
                }
            }
            for k in tok[i] as usize..mid[i] as usize {
                let p = partial[k];
                if p.n_remain == 0 || m.partial_ok(s, p) {
                    let id = sorted[k];
                    mask[id as usize / 64] |= 1 << (id % 64);
                }
            }
            if m.has_tokens[s as usize] {
                Self::visit_token_tops(m, &v, i, s, mask);
            }
            i += 1;
        }
        Undecided {
            open: open.into_boxed_slice(),
            path: path.into_boxed_slice(),
        }
    }

    /// The tokens decided at trie node `n` reached with stack set `s`.
    fn visit(m: &Machine, v: &TokenIndex, n: usize, s: u32, mask: &mut [u64]) {
        for k in v.node_tok[n] as usize..v.node_mid[n] as usize {
            let p = v.sorted_partial[k];
            if p.n_remain == 0 || m.partial_ok(s, p) {
                let id = v.sorted[k];
                mask[id as usize / 64] |= 1 << (id % 64);
            }
        }
        if m.has_tokens[s as usize] {
            Self::visit_token_tops(m, v, n, s, mask);
        }
    }

    /// A token rule on top decides every token still going on below this node by its
    /// id alone, as llama.cpp's candidate rejection does.
    #[cold]
    fn visit_token_tops(m: &Machine, v: &TokenIndex, n: usize, s: u32, mask: &mut [u64]) {
        let lo = v.node_mid[n] as usize;
        let hi = v.subtree_tok_end(n);
        for &(neg, t) in m.sets[s as usize].token_tops.iter() {
            for &id in &v.sorted[lo..hi] {
                if (id == t) != neg {
                    mask[id as usize / 64] |= 1 << (id % 64);
                }
            }
        }
    }

    /// Advances past token `id` (`llama_grammar_accept_impl`). An end-of-generation
    /// token is accepted only where the grammar may end, and changes nothing.
    pub fn accept(&mut self, id: u32) -> Result<(), MatchError> {
        self.begin()?;
        let Some(piece) = self.vocab.pieces.get(id as usize) else {
            return Err(MatchError::UnknownToken(id));
        };
        if self.vocab.is_eog[id as usize] {
            return if self.is_accepting() {
                Ok(())
            } else {
                Err(MatchError::EndNotAllowed)
            };
        }
        let piece = piece.clone();
        match self.accept_piece(Some(id), &piece) {
            Some(()) => Ok(()),
            None => Err(self
                .m
                .overflow
                .clone()
                .unwrap_or_else(|| MatchError::Rejected {
                    token: id,
                    text: String::from_utf8_lossy(&piece).into_owned(),
                })),
        }
    }

    /// Advances past text that was not sampled (`llama_grammar_accept_str`), such as
    /// a prefilled start of the answer.
    pub fn accept_str(&mut self, text: &str) -> Result<(), MatchError> {
        self.accept_bytes(text.as_bytes())
    }

    /// [`Matcher::accept_str`] for bytes that may end inside a UTF-8 sequence.
    pub fn accept_bytes(&mut self, text: &[u8]) -> Result<(), MatchError> {
        self.begin()?;
        self.accept_piece(None, text).ok_or_else(|| {
            self.m
                .overflow
                .clone()
                .unwrap_or_else(|| MatchError::Rejected {
                    token: u32::MAX,
                    text: String::from_utf8_lossy(text).into_owned(),
                })
        })
    }

    fn accept_piece(&mut self, id: Option<u32>, piece: &[u8]) -> Option<()> {
        let mut cps = std::mem::take(&mut self.scratch);
        let end = decode_utf8(piece, self.partial, &mut cps);
        let cur = self.cur;
        let mut out: Vec<u32> = self.m.new_out();
        // Stacks waiting for a token: advance those the token matches.
        if let Some(id) = id {
            let stacks = self.m.sets[cur as usize].stacks.clone();
            for &s in stacks.iter() {
                if s == EMPTY_STACK {
                    continue;
                }
                let (pos, parent) = self.m.pop(s);
                let hit = match self.m.prog.elems[pos as usize] {
                    Element::Token(t) => t == id,
                    Element::TokenNot(t) => t != id,
                    _ => continue,
                };
                if hit {
                    let next = if self.m.prog.is_end(pos + 1) {
                        parent
                    } else {
                        self.m.push(parent, pos + 1)
                    };
                    self.m.advance(next, &mut out);
                }
            }
        }
        // Stacks on a character class consume the code points. Text that was not a
        // token (`llama_grammar_accept_str`) keeps every stack while no complete code
        // point has come; a token drops the empty and token-waiting stacks.
        let mut set = if id.is_some() {
            let chars = self.m.sets[cur as usize].char_stacks.to_vec();
            self.m.intern_set(chars)
        } else {
            cur
        };
        for &c in &cps {
            set = self.m.step(set, c);
            if set == DEAD {
                break;
            }
        }
        out.extend_from_slice(&self.m.sets[set as usize].stacks);
        self.scratch = cps;
        if self.m.overflow.is_some() {
            return None;
        }
        let next = self.m.intern_set(out);
        if next == DEAD {
            return None;
        }
        self.cur = next;
        self.partial = end;
        if self.m.nodes.len() > MAX_NODES || self.m.trans.len() > MAX_TRANS {
            self.compact();
        }
        Some(())
    }

    /// Rebuilds the interned state around the current stacks so that a long
    /// generation does not grow it without bound.
    fn compact(&mut self) {
        let old = &self.m;
        let stacks: Vec<Vec<u32>> = old.sets[self.cur as usize]
            .stacks
            .iter()
            .map(|&s| {
                let mut elems = Vec::new();
                let mut s = s;
                while s != EMPTY_STACK {
                    let (pos, parent) = old.pop(s);
                    elems.push(pos);
                    s = parent;
                }
                elems.reverse();
                elems
            })
            .collect();
        let prog = std::mem::replace(
            &mut self.m.prog,
            Program {
                elems: Vec::new(),
                alts: Vec::new(),
                class_at: Vec::new(),
                classes: Vec::new(),
                boundaries: Vec::new(),
            },
        );
        let mut m = Machine::new(prog);
        m.overflow = self.m.overflow.take();
        m.total_work = self.m.total_work;
        let ids: Vec<u32> = stacks
            .iter()
            .map(|elems| elems.iter().fold(EMPTY_STACK, |s, &pos| m.push(s, pos)))
            .collect();
        self.cur = m.intern_set(ids);
        self.m = m;
        self.masks.clear();
        self.tmasks.clear();
    }
}

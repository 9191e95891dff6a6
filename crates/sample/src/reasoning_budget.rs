//! llama.cpp's reasoning budget (`common/reasoning-budget.cpp`, `--reasoning-budget N`): at
//! most N generated tokens inside a reasoning block (`<think>` … `</think>`). Once the budget
//! is spent (and the last token completed its UTF-8 character) the end tag, after an optional
//! message, is forced token by token: every other logit is -inf. A natural end tag ends the
//! count; a new start tag arms a fresh budget.

/// Where a [`ReasoningBudget`] is (llama.cpp's `common_reasoning_budget_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetState {
    /// Waiting for a start sequence.
    Idle,
    /// Inside a reasoning block, counting down.
    Counting,
    /// Budget spent, the last token ended inside a UTF-8 character: one more may finish it.
    WaitingUtf8,
    /// Forcing the end sequence.
    Forcing,
    /// Past the block (until another start sequence).
    Done,
}

/// Finds the longest of a set of token sequences ending at each token (llama.cpp's
/// Aho-Corasick `token_matcher`, with the same reset after a match).
#[derive(Clone, Debug)]
struct SeqMatcher {
    seqs: Vec<Vec<u32>>,
    recent: Vec<u32>,
    longest: usize,
}

impl SeqMatcher {
    fn new(seqs: &[Vec<u32>]) -> SeqMatcher {
        let mut unique: Vec<Vec<u32>> = Vec::new();
        for s in seqs {
            if !s.is_empty() && !unique.contains(s) {
                unique.push(s.clone());
            }
        }
        let longest = unique.iter().map(Vec::len).max().unwrap_or(0);
        SeqMatcher {
            seqs: unique,
            recent: Vec::new(),
            longest,
        }
    }

    /// The index of the longest sequence ending with `token` (the history restarts after a
    /// match), if any.
    fn advance(&mut self, token: u32) -> Option<usize> {
        if self.longest == 0 {
            return None;
        }
        self.recent.push(token);
        if self.recent.len() > self.longest {
            self.recent.remove(0);
        }
        let found = self
            .seqs
            .iter()
            .enumerate()
            .filter(|(_, s)| self.recent.ends_with(s))
            .max_by_key(|(i, s)| (s.len(), std::cmp::Reverse(*i)))
            .map(|(i, _)| i);
        if found.is_some() {
            self.recent.clear();
        }
        found
    }

    fn reset(&mut self) {
        self.recent.clear();
    }
}

/// The reasoning budget of one generation.
#[derive(Clone, Debug)]
pub struct ReasoningBudget {
    start: SeqMatcher,
    end: SeqMatcher,
    forced: Vec<u32>,
    budget: i32,
    remaining: i32,
    state: BudgetState,
    force_pos: usize,
    end_match: Option<usize>,
}

impl ReasoningBudget {
    /// A budget of `budget` tokens (negative: unlimited) for blocks opened by `start` and
    /// closed by any of `end`; `forced` (the message then the first end sequence) is what is
    /// forced when it runs out. As llama.cpp, the generation prompt's tokens are then given
    /// to [`ReasoningBudget::accept`], so a template that opens the block starts the count.
    pub fn new(
        start: Vec<u32>,
        end: &[Vec<u32>],
        forced: Vec<u32>,
        budget: i32,
    ) -> ReasoningBudget {
        let budget = if budget < 0 { i32::MAX } else { budget };
        ReasoningBudget {
            start: SeqMatcher::new(&[start]),
            end: SeqMatcher::new(end),
            forced,
            budget,
            remaining: budget,
            state: BudgetState::Idle,
            force_pos: 0,
            end_match: None,
        }
    }

    pub fn state(&self) -> BudgetState {
        self.state
    }

    /// The token the next sample must be, while the end sequence is being forced.
    pub fn forced_token(&self) -> Option<u32> {
        (self.state == BudgetState::Forcing)
            .then(|| self.forced.get(self.force_pos).copied())
            .flatten()
    }

    /// Sets every logit but the forced token's to -inf (nothing when not forcing).
    pub fn apply(&self, logits: &mut [f32]) {
        if let Some(t) = self.forced_token() {
            for (i, l) in logits.iter_mut().enumerate() {
                if i != t as usize {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Records a generated token; `piece` is its text (whether it completes a UTF-8
    /// character decides when forcing may start).
    pub fn accept(&mut self, token: u32, piece: &[u8]) {
        match self.state {
            BudgetState::Idle => {
                if self.start.advance(token).is_some() {
                    self.arm();
                }
            }
            BudgetState::Counting | BudgetState::WaitingUtf8 => {
                if let Some(m) = self.end.advance(token) {
                    self.state = BudgetState::Done;
                    self.end_match = Some(m);
                    return;
                }
                let complete = utf8_is_complete(piece);
                if self.state == BudgetState::WaitingUtf8 {
                    if complete {
                        self.force();
                    }
                } else {
                    self.remaining -= 1;
                    if self.remaining <= 0 {
                        if complete {
                            self.force();
                        } else {
                            self.state = BudgetState::WaitingUtf8;
                            self.end.reset();
                        }
                    }
                }
            }
            BudgetState::Forcing => {
                let m = self.end.advance(token);
                self.force_pos += 1;
                if self.force_pos >= self.forced.len() {
                    self.state = BudgetState::Done;
                    self.end_match = m;
                }
            }
            BudgetState::Done => {
                if self.start.advance(token).is_some() {
                    self.end.reset();
                    self.end_match = None;
                    self.arm();
                }
            }
        }
    }

    fn arm(&mut self) {
        self.remaining = self.budget;
        self.state = BudgetState::Counting;
        if self.remaining <= 0 {
            self.state = BudgetState::Forcing;
            self.force_pos = 0;
        }
    }

    fn force(&mut self) {
        self.state = BudgetState::Forcing;
        self.force_pos = 0;
        self.end.reset();
    }
}

/// Whether `s` does not end inside a UTF-8 character (llama.cpp's `common_utf8_is_complete`).
fn utf8_is_complete(s: &[u8]) -> bool {
    if s.is_empty() {
        return true;
    }
    for i in 1..=s.len().min(4) {
        let c = s[s.len() - i];
        if c & 0xC0 != 0x80 {
            let expected = if c >= 0xF0 {
                4
            } else if c >= 0xE0 {
                3
            } else if c >= 0xC0 {
                2
            } else {
                1
            };
            return i >= expected;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: u32 = 100;
    const END: u32 = 101;

    fn budget(n: i32, open: bool) -> ReasoningBudget {
        let mut b = ReasoningBudget::new(vec![START], &[vec![END]], vec![7, END], n);
        if open {
            b.accept(START, b"<think>");
        }
        b
    }

    #[test]
    fn counts_then_forces_the_message_and_end_tag() {
        let mut b = budget(3, false);
        b.accept(5, b"a");
        assert_eq!(b.state(), BudgetState::Idle);
        b.accept(START, b"<think>");
        assert_eq!(b.state(), BudgetState::Counting);
        for t in [1, 2] {
            b.accept(t, b"x");
            assert_eq!(b.forced_token(), None);
        }
        b.accept(3, b"x");
        assert_eq!(b.forced_token(), Some(7));
        let mut logits = vec![1.0f32; 128];
        b.apply(&mut logits);
        assert!(
            logits
                .iter()
                .enumerate()
                .all(|(i, &l)| (i == 7) == l.is_finite())
        );
        b.accept(7, b"...");
        assert_eq!(b.forced_token(), Some(END));
        b.accept(END, b"</think>");
        assert_eq!(b.state(), BudgetState::Done);
        // A new block gets a fresh budget.
        b.accept(START, b"<think>");
        assert_eq!(b.state(), BudgetState::Counting);
    }

    #[test]
    fn a_natural_end_stops_counting_and_zero_forces_at_once() {
        let mut b = budget(10, true);
        b.accept(1, b"x");
        b.accept(END, b"</think>");
        assert_eq!(b.state(), BudgetState::Done);
        assert_eq!(budget(0, true).forced_token(), Some(7));
        // Unlimited never forces.
        let mut b = budget(-1, true);
        for _ in 0..1000 {
            b.accept(1, b"x");
        }
        assert_eq!(b.state(), BudgetState::Counting);
    }

    #[test]
    fn forcing_waits_for_a_whole_character() {
        let mut b = budget(1, true);
        b.accept(1, &[0xC3]);
        assert_eq!(b.state(), BudgetState::WaitingUtf8);
        // As llama.cpp, each piece is judged alone: a lone continuation byte is not whole.
        b.accept(2, &[0xA9]);
        assert_eq!(b.state(), BudgetState::WaitingUtf8);
        b.accept(3, b"x");
        assert_eq!(b.forced_token(), Some(7));
        assert!(utf8_is_complete("é".as_bytes()));
        assert!(!utf8_is_complete(&[0xE2, 0x82]));
        assert!(utf8_is_complete(b""));
    }

    #[test]
    fn multi_token_tags_match_across_tokens() {
        let mut b = ReasoningBudget::new(vec![1, 2], &[vec![3, 4], vec![4]], vec![3, 4], 5);
        b.accept(1, b"<");
        b.accept(9, b"x");
        b.accept(2, b">");
        assert_eq!(b.state(), BudgetState::Idle);
        b.accept(1, b"<");
        b.accept(2, b">");
        assert_eq!(b.state(), BudgetState::Counting);
        b.accept(3, b"<");
        b.accept(4, b">");
        assert_eq!(b.state(), BudgetState::Done);
        assert_eq!(b.end_match, Some(0));
    }
}

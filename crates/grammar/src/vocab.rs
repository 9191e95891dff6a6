//! The vocabulary as the grammar sees it: each token's text (llama.cpp's
//! `token_to_piece` with special tokens rendered), decoded to code points once, and a
//! trie over those code-point strings in preorder, so one walk computes the mask for
//! every token sharing a prefix at once.

use crate::utf8::{Partial, decode_utf8};

/// Which tokens end the generation, and every token's piece (cut at the first NUL, as
/// llama.cpp's C-string decoding reads it).
#[derive(Debug)]
pub struct TokenIndex {
    pub(crate) n_vocab: usize,
    pub(crate) pieces: Vec<Box<[u8]>>,
    pub(crate) eog: Vec<u32>,
    pub(crate) is_eog: Vec<bool>,
    // Trie nodes in preorder; node 0 is the root (the empty prefix).
    pub(crate) node_cp: Vec<u32>,
    pub(crate) node_depth: Vec<u32>,
    /// Index of the first node after this node's subtree.
    pub(crate) node_end: Vec<u32>,
    /// `sorted[node_tok[n]..node_mid[n]]` end exactly at node n; tokens of the subtree
    /// strictly below n follow, up to `node_tok` of `node_end[n]`.
    pub(crate) node_tok: Vec<u32>,
    pub(crate) node_mid: Vec<u32>,
    /// Token ids in trie order, with the partial UTF-8 sequence each ends in.
    pub(crate) sorted: Vec<u32>,
    pub(crate) sorted_partial: Vec<Partial>,
    pub(crate) max_depth: usize,
    /// The distinct code points of the trie, sorted; `node_alpha[n]` indexes it.
    pub(crate) alphabet: Vec<u32>,
    pub(crate) node_alpha: Vec<u32>,
    /// Masks of truncated stack sets, shared by the matchers of this vocabulary.
    pub(crate) shared_masks: crate::matcher::SharedMasks,
    /// The last grammar's class boundaries and the interval of every node under them.
    pub(crate) intervals: std::sync::Mutex<Option<NodeIntervals>>,
}

pub(crate) type NodeIntervals = (Vec<u32>, std::sync::Arc<[u32]>);

impl TokenIndex {
    /// `pieces[id]` is token `id`'s text with special tokens rendered
    /// (`token_to_piece(id, special = true)`); `is_eog(id)` says whether it ends a
    /// generation.
    pub fn new(pieces: Vec<Vec<u8>>, is_eog: impl Fn(u32) -> bool) -> TokenIndex {
        let n_vocab = pieces.len();
        let pieces: Vec<Box<[u8]>> = pieces
            .into_iter()
            .map(|mut p| {
                if let Some(z) = p.iter().position(|&b| b == 0) {
                    p.truncate(z);
                }
                p.into_boxed_slice()
            })
            .collect();
        let is_eog: Vec<bool> = (0..n_vocab as u32).map(is_eog).collect();
        let eog = (0..n_vocab as u32)
            .filter(|&i| is_eog[i as usize])
            .collect();

        // Tokens a grammar can ever allow: not end-of-generation, non-empty, and valid
        // UTF-8 up to a possibly incomplete last sequence.
        let mut entries: Vec<(Vec<u32>, Partial, u32)> = Vec::with_capacity(n_vocab);
        let mut cps = Vec::new();
        for (id, piece) in pieces.iter().enumerate() {
            if is_eog[id] || piece.is_empty() {
                continue;
            }
            let partial = decode_utf8(piece, Partial::NONE, &mut cps);
            if partial.n_remain < 0 {
                continue;
            }
            entries.push((cps.clone(), partial, id as u32));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0).then(a.2.cmp(&b.2)));

        let mut t = TokenIndex {
            n_vocab,
            pieces,
            eog,
            is_eog,
            node_cp: vec![0],
            node_depth: vec![0],
            node_end: vec![0],
            node_tok: vec![0],
            node_mid: vec![0],
            sorted: Vec::with_capacity(entries.len()),
            sorted_partial: Vec::with_capacity(entries.len()),
            max_depth: 0,
            alphabet: Vec::new(),
            node_alpha: Vec::new(),
            shared_masks: Default::default(),
            intervals: Default::default(),
        };
        // `path[d]` is the node at depth d on the current branch; `path_cp` its label.
        let mut path: Vec<u32> = vec![0];
        let mut path_cp: Vec<u32> = Vec::new();
        for (k, (cps, partial, id)) in entries.into_iter().enumerate() {
            let common = path_cp.iter().zip(&cps).take_while(|(a, b)| a == b).count();
            while path_cp.len() > common {
                let n = path.pop().unwrap_or(0);
                path_cp.pop();
                t.node_end[n as usize] = t.node_cp.len() as u32;
            }
            for &cp in &cps[common..] {
                let n = t.node_cp.len() as u32;
                t.node_cp.push(cp);
                t.node_depth.push(path.len() as u32);
                t.node_end.push(0);
                t.node_tok.push(k as u32);
                t.node_mid.push(k as u32);
                path.push(n);
                path_cp.push(cp);
            }
            let last = *path.last().unwrap_or(&0) as usize;
            t.node_mid[last] = k as u32 + 1;
            t.sorted.push(id);
            t.sorted_partial.push(partial);
            t.max_depth = t.max_depth.max(cps.len());
        }
        let n_nodes = t.node_cp.len() as u32;
        for n in path {
            t.node_end[n as usize] = n_nodes;
        }
        let mut alphabet = t.node_cp[1..].to_vec();
        alphabet.sort_unstable();
        alphabet.dedup();
        t.node_alpha = t
            .node_cp
            .iter()
            .map(|c| alphabet.binary_search(c).unwrap_or(0) as u32)
            .collect();
        t.alphabet = alphabet;
        t
    }

    /// Forgets the masks matchers share through this vocabulary (for measuring the
    /// uncached cost).
    pub fn clear_shared_masks(&self) {
        self.shared_masks.clear();
        *self.intervals.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    pub fn n_nodes(&self) -> usize {
        self.node_cp.len()
    }

    /// Token `id`'s text as grammars read it (empty outside the vocabulary).
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |p| p)
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.is_eog.get(id as usize).copied().unwrap_or(false)
    }

    /// End of the tokens of node n's subtree in `sorted`.
    pub(crate) fn subtree_tok_end(&self, n: usize) -> usize {
        let end = self.node_end[n] as usize;
        if end < self.node_tok.len() {
            self.node_tok[end] as usize
        } else {
            self.sorted.len()
        }
    }
}

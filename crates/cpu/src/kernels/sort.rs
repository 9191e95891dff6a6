//! Index sorts as ggml-cpu does them with libstdc++: `ggml_compute_forward_argsort_f32` runs
//! `std::sort` (introsort) and `ggml_compute_forward_top_k_f32` runs `std::partial_sort`
//! (heap select) over row indices compared by value. Neither is stable, so which of two equal
//! values comes first is decided by the algorithm's exact sequence of comparisons and swaps;
//! this is a line-by-line port of libstdc++'s `__introsort_loop`,
//! `__unguarded_partition_pivot`, `__move_median_to_first`, `__final_insertion_sort` and the
//! heap routines of `stl_heap.h` (unchanged since GCC 4.x), so ties come out as they do in
//! llama.cpp.
//!
//! libstdc++ relies on the comparison being a strict weak ordering to leave its scans
//! unguarded; with NaNs (`x > y` is not one) it may read out of bounds. Here every scan is also
//! bounded by its range: with a valid ordering the bounds never bind, so the results are the
//! same, and with NaNs the result is some permutation instead of undefined behaviour.

/// Which way a row is sorted. `comp(a, b)` is `x[a] < x[b]` (ascending) or `x[a] > x[b]`
/// (descending), ggml's `cmp_argsort`.
#[derive(Clone, Copy)]
struct Cmp<'a> {
    x: &'a [f32],
    desc: bool,
}

impl Cmp<'_> {
    #[inline(always)]
    fn lt(&self, a: i32, b: i32) -> bool {
        let (va, vb) = (self.x[a as usize], self.x[b as usize]);
        if self.desc { va > vb } else { va < vb }
    }
}

/// `std::sort(idx, idx + n, cmp)` with ggml's comparator over the values `x`.
pub fn sort_indices(idx: &mut [i32], x: &[f32], descending: bool) {
    let c = Cmp {
        x,
        desc: descending,
    };
    let n = idx.len();
    if n == 0 {
        return;
    }
    // std::__lg(n) * 2
    let depth = 2 * (usize::BITS - 1 - n.leading_zeros()) as usize;
    introsort_loop(idx, 0, n, depth, c);
    final_insertion_sort(idx, 0, n, c);
}

/// `std::partial_sort(idx, idx + k, idx + n, cmp)` with ggml-cpu's top-k comparator
/// (`x[a] > x[b]`).
pub fn partial_sort_desc(idx: &mut [i32], k: usize, x: &[f32]) {
    let c = Cmp { x, desc: true };
    let k = k.min(idx.len());
    heap_select(idx, 0, k, idx.len(), c);
    sort_heap(idx, 0, k, c);
}

const THRESHOLD: usize = 16;

fn introsort_loop(v: &mut [i32], first: usize, mut last: usize, mut depth: usize, c: Cmp<'_>) {
    while last - first > THRESHOLD {
        if depth == 0 {
            // std::__partial_sort(first, last, last): heap sort
            heap_select(v, first, last, last, c);
            sort_heap(v, first, last, c);
            return;
        }
        depth -= 1;
        let cut = unguarded_partition_pivot(v, first, last, c);
        introsort_loop(v, cut, last, depth, c);
        last = cut;
    }
}

fn unguarded_partition_pivot(v: &mut [i32], first: usize, last: usize, c: Cmp<'_>) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(v, first, first + 1, mid, last - 1, c);
    unguarded_partition(v, first + 1, last, first, c)
}

fn move_median_to_first(v: &mut [i32], result: usize, a: usize, b: usize, cc: usize, c: Cmp<'_>) {
    let lt = |i: usize, j: usize, v: &[i32]| c.lt(v[i], v[j]);
    let pick = if lt(a, b, v) {
        if lt(b, cc, v) {
            b
        } else if lt(a, cc, v) {
            cc
        } else {
            a
        }
    } else if lt(a, cc, v) {
        a
    } else if lt(b, cc, v) {
        cc
    } else {
        b
    };
    v.swap(result, pick);
}

/// `__unguarded_partition(first, last, pivot)`: the scans stop at the pivot (just before
/// `first`, where libstdc++'s own sentinel is) and at `last` (see the module comment).
fn unguarded_partition(
    v: &mut [i32],
    mut first: usize,
    mut last: usize,
    pivot: usize,
    c: Cmp<'_>,
) -> usize {
    let hi = last;
    loop {
        while first < hi && c.lt(v[first], v[pivot]) {
            first += 1;
        }
        last -= 1;
        while last > pivot && c.lt(v[pivot], v[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        v.swap(first, last);
        first += 1;
    }
}

fn final_insertion_sort(v: &mut [i32], first: usize, last: usize, c: Cmp<'_>) {
    if last - first > THRESHOLD {
        insertion_sort(v, first, first + THRESHOLD, c);
        for i in first + THRESHOLD..last {
            unguarded_linear_insert(v, first, i, c);
        }
    } else {
        insertion_sort(v, first, last, c);
    }
}

fn insertion_sort(v: &mut [i32], first: usize, last: usize, c: Cmp<'_>) {
    if first == last {
        return;
    }
    for i in first + 1..last {
        if c.lt(v[i], v[first]) {
            let val = v[i];
            v.copy_within(first..i, first + 1);
            v[first] = val;
        } else {
            unguarded_linear_insert(v, first, i, c);
        }
    }
}

/// `__unguarded_linear_insert(last)`, not moving below `floor`.
fn unguarded_linear_insert(v: &mut [i32], floor: usize, mut last: usize, c: Cmp<'_>) {
    let val = v[last];
    while last > floor && c.lt(val, v[last - 1]) {
        v[last] = v[last - 1];
        last -= 1;
    }
    v[last] = val;
}

fn heap_select(v: &mut [i32], first: usize, middle: usize, last: usize, c: Cmp<'_>) {
    make_heap(v, first, middle, c);
    for i in middle..last {
        if c.lt(v[i], v[first]) {
            pop_heap(v, first, middle, i, c);
        }
    }
}

fn make_heap(v: &mut [i32], first: usize, last: usize, c: Cmp<'_>) {
    let len = last - first;
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let value = v[first + parent];
        adjust_heap(v, first, parent, len, value, c);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

fn sort_heap(v: &mut [i32], first: usize, mut last: usize, c: Cmp<'_>) {
    while last - first > 1 {
        last -= 1;
        pop_heap(v, first, last, last, c);
    }
}

fn pop_heap(v: &mut [i32], first: usize, last: usize, result: usize, c: Cmp<'_>) {
    let value = v[result];
    v[result] = v[first];
    adjust_heap(v, first, 0, last - first, value, c);
}

fn adjust_heap(v: &mut [i32], first: usize, mut hole: usize, len: usize, value: i32, c: Cmp<'_>) {
    // libstdc++'s signed distances: `(len - 1) / 2` and `(len - 2) / 2` truncate toward zero.
    let l = len as isize;
    let top = hole;
    let mut second = hole;
    while (second as isize) < (l - 1) / 2 {
        second = 2 * (second + 1);
        if c.lt(v[first + second], v[first + second - 1]) {
            second -= 1;
        }
        v[first + hole] = v[first + second];
        hole = second;
    }
    if l & 1 == 0 && second as isize == (l - 2) / 2 {
        second = 2 * (second + 1);
        v[first + hole] = v[first + second - 1];
        hole = second - 1;
    }
    // __push_heap(first, hole, top, value)
    let mut parent = hole.wrapping_sub(1) / 2;
    while hole > top && c.lt(v[first + parent], value) {
        v[first + hole] = v[first + parent];
        hole = parent;
        parent = hole.wrapping_sub(1) / 2;
    }
    v[first + hole] = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(x: &[f32], desc: bool) -> Vec<i32> {
        let mut idx: Vec<i32> = (0..x.len() as i32).collect();
        sort_indices(&mut idx, x, desc);
        idx
    }

    #[test]
    fn sorts_every_length_and_order() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for n in 0..300 {
            for levels in [0u64, 2, 5] {
                let x: Vec<f32> = (0..n)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        if levels == 0 {
                            (s >> 40) as f32
                        } else {
                            (s % levels) as f32
                        }
                    })
                    .collect();
                for desc in [false, true] {
                    let idx = sorted(&x, desc);
                    let mut seen = vec![false; n];
                    for &i in &idx {
                        assert!(!seen[i as usize]);
                        seen[i as usize] = true;
                    }
                    for w in idx.windows(2) {
                        let (a, b) = (x[w[0] as usize], x[w[1] as usize]);
                        assert!(if desc { a >= b } else { a <= b }, "n={n} desc={desc}");
                    }
                }
                for k in [0, 1, n / 2, n].into_iter().filter(|&k| k <= n) {
                    let mut idx: Vec<i32> = (0..n as i32).collect();
                    partial_sort_desc(&mut idx, k, &x);
                    let full = sorted(&x, true);
                    for j in 0..k {
                        assert_eq!(x[idx[j] as usize], x[full[j] as usize]);
                    }
                }
            }
        }
    }

    #[test]
    fn nans_give_a_permutation() {
        let x: Vec<f32> = (0..100)
            .map(|i| if i % 3 == 0 { f32::NAN } else { i as f32 })
            .collect();
        for desc in [false, true] {
            let mut idx = sorted(&x, desc);
            idx.sort();
            assert_eq!(idx, (0..100).collect::<Vec<_>>());
        }
        let mut idx: Vec<i32> = (0..100).collect();
        partial_sort_desc(&mut idx, 10, &x);
        idx.sort();
        assert_eq!(idx, (0..100).collect::<Vec<_>>());
    }
}

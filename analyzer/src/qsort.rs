//! glibc's `qsort` order: a top-down merge sort (glibc's `msort`), reproduced so that comparators that
//! are not total orders (gprof's `cmp_bb` compares files only when both symbols have one) leave the
//! elements in exactly the order gprof prints them.

use std::cmp::Ordering;

/// Sort `v` as glibc 2.36's `qsort` does with `cmp`.
pub fn msort<T: Copy>(v: &mut [T], cmp: &mut impl FnMut(&T, &T) -> Ordering) {
    let n = v.len();
    if n <= 1 {
        return;
    }
    let n1 = n / 2;
    msort(&mut v[..n1], cmp);
    msort(&mut v[n1..], cmp);
    let mut merged = Vec::with_capacity(n);
    let (mut i, mut j) = (0, n1);
    while i < n1 && j < n {
        if cmp(&v[i], &v[j]) != Ordering::Greater {
            merged.push(v[i]);
            i += 1;
        } else {
            merged.push(v[j]);
            j += 1;
        }
    }
    merged.extend_from_slice(&v[i..n1]);
    merged.extend_from_slice(&v[j..]);
    v.copy_from_slice(&merged);
}

/// [`msort`] for elements that are not `Copy`: sorts indices, then moves the elements.
pub fn msort_by<T>(v: &mut Vec<T>, cmp: &mut impl FnMut(&T, &T) -> Ordering) {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    msort(&mut idx, &mut |&l, &r| cmp(&v[l], &v[r]));
    let mut slots: Vec<Option<T>> = std::mem::take(v).into_iter().map(Some).collect();
    v.extend(idx.into_iter().filter_map(|i| slots[i].take()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_and_is_stable() {
        let mut v = [(3, 'a'), (1, 'b'), (3, 'c'), (2, 'd'), (1, 'e')];
        msort(&mut v, &mut |a: &(i32, char), b: &(i32, char)| {
            a.0.cmp(&b.0)
        });
        assert_eq!(v, [(1, 'b'), (1, 'e'), (2, 'd'), (3, 'a'), (3, 'c')]);
    }
}

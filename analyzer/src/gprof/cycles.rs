//! Depth-first numbering of the call graph and cycle detection, with GNU gprof's exact visiting order
//! (so cycle numbers, cycle heads and member order match gprof), but iterative and with O(1) lookups of
//! stack positions and chain tails so that large graphs stay fast.

use crate::gprof::graph::{DFN_BUSY, DFN_NAN, Graph, NONE, Sym};

struct Dfn {
    /// The depth-first stack, 1-based like gprof's (`stack[0]` unused).
    stack: Vec<usize>,
    /// Position of each symbol on the stack, 0 when not on it.
    pos: Vec<usize>,
    /// Last member of the chain starting at each cycle head.
    tail: Vec<usize>,
    /// For each stack position `i`, a position `f < i` such that every entry in `(f, i]` is already in
    /// the cycle of the entry at `i` (`NONE` when unknown). Lets repeated back edges into a deep stack
    /// skip what earlier ones glommed, which keeps large strongly connected graphs near-linear.
    floor: Vec<usize>,
    counter: i64,
}

impl Dfn {
    fn find_cycle(&mut self, g: &mut Graph, child: usize) {
        let depth = self.stack.len() - 1;
        let mut cycle_top = self.pos[child];
        let h = g.syms[child].cyc_head;
        if h != child && self.pos[h] > cycle_top {
            cycle_top = self.pos[h];
        }
        if cycle_top == 0 || cycle_top == depth {
            return;
        }
        let mut head = self.stack[cycle_top];
        if g.syms[head].cyc_head != head {
            head = g.syms[head].cyc_head;
        }
        let mut tail = self.tail[head];
        // Walk down from the top, jumping over stretches glommed before, and collect the entries
        // still on their own; then glom them bottom-up, the order gprof appends them in.
        let mut fresh = Vec::new();
        let mut i = depth;
        while i > cycle_top {
            let f = self.floor[i];
            self.floor[i] = cycle_top;
            if f != NONE && f <= cycle_top {
                break;
            }
            let c = self.stack[i];
            if g.syms[c].cyc_head == c {
                fresh.push(c);
            }
            i = if f != NONE && f < i {
                f.max(cycle_top)
            } else {
                i - 1
            };
        }
        for &c in fresh.iter().rev() {
            g.syms[tail].cyc_next = c;
            g.syms[c].cyc_head = head;
            let mut t = c;
            while g.syms[t].cyc_next != NONE {
                let n = g.syms[t].cyc_next;
                g.syms[n].cyc_head = head;
                t = n;
            }
            tail = t;
        }
        self.tail[head] = tail;
    }

    fn pre_visit(&mut self, g: &mut Graph, s: usize) {
        self.stack.push(s);
        self.pos[s] = self.stack.len() - 1;
        if self.floor.len() < self.stack.len() {
            self.floor.push(NONE);
        }
        self.floor[self.stack.len() - 1] = NONE;
        g.syms[s].top_order = DFN_BUSY;
    }

    fn post_visit(&mut self, g: &mut Graph, s: usize) {
        if g.syms[s].cyc_head == s {
            self.counter += 1;
            let mut m = s;
            while m != NONE {
                g.syms[m].top_order = self.counter;
                m = g.syms[m].cyc_next;
            }
        }
        self.stack.pop();
        self.pos[s] = 0;
    }
}

fn is_numbered(s: &Sym) -> bool {
    s.top_order != DFN_NAN && s.top_order != DFN_BUSY
}

/// Number every symbol topologically (callers get higher numbers) and glom cycles, visiting roots in
/// table order and each symbol's children most-recent-arc first, as gprof's `cg_dfn` does.
pub fn number(g: &mut Graph) {
    let n = g.nsyms;
    let mut d = Dfn {
        stack: vec![NONE],
        pos: vec![0; n],
        tail: (0..n).collect(),
        floor: vec![NONE],
        counter: DFN_NAN,
    };
    let mut frames: Vec<(usize, usize)> = Vec::new();
    for root in 0..n {
        if g.syms[root].top_order != DFN_NAN {
            continue;
        }
        d.pre_visit(g, root);
        frames.push((root, g.syms[root].children.len()));
        while let Some(&mut (p, ref mut remaining)) = frames.last_mut() {
            if *remaining == 0 {
                frames.pop();
                d.post_visit(g, p);
                continue;
            }
            *remaining -= 1;
            let arc = g.syms[p].children[*remaining];
            let child = g.arcs[arc].child;
            if is_numbered(&g.syms[child]) {
                continue;
            }
            if g.syms[child].top_order != DFN_NAN {
                d.find_cycle(g, child);
                continue;
            }
            d.pre_visit(g, child);
            frames.push((child, g.syms[child].children.len()));
        }
    }
}

/// Create one pseudo-symbol per cycle (numbered in table order of the cycle heads), link members to it
/// and count calls into the cycle and among its members (gprof's `cycle_link`).
pub fn link(g: &mut Graph) {
    let heads: Vec<usize> = (0..g.nsyms)
        .filter(|&s| g.syms[s].cyc_head == s && g.syms[s].cyc_next != NONE)
        .collect();
    g.syms.truncate(g.nsyms);
    g.num_cycles = heads.len();
    for (i, &head) in heads.iter().enumerate() {
        let num = (i + 1) as u32;
        let cyc = g.syms.len();
        g.syms.push(Sym {
            is_cycle: true,
            print_flag: true,
            top_order: DFN_NAN,
            cyc_num: num,
            cyc_head: cyc,
            cyc_next: head,
            ..Sym::default()
        });
        let mut m = head;
        while m != NONE {
            g.syms[m].cyc_num = num;
            g.syms[m].cyc_head = cyc;
            m = g.syms[m].cyc_next;
        }
        let mut m = head;
        let (mut inside, mut outside) = (0u64, 0u64);
        while m != NONE {
            for &a in &g.syms[m].parents {
                let arc = &g.arcs[a];
                if arc.parent == m {
                    continue;
                }
                if g.syms[arc.parent].cyc_num == num {
                    inside += arc.count;
                } else {
                    outside += arc.count;
                }
            }
            m = g.syms[m].cyc_next;
        }
        g.syms[cyc].self_calls = inside;
        g.syms[cyc].ncalls = outside;
    }
}

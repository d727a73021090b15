//! `STRICT_SPREAD` as a matching of bundles to nodes: [`Problem::strict_spread`] finds a
//! node of its own for every bundle, or the bundles for which too few nodes have room (what
//! the feasibility check reports).

use super::problem::Problem;

/// Bundles that cannot each get a node of their own, and how many nodes could host them.
pub(super) struct Stuck {
    pub(super) bundles: Vec<usize>,
    pub(super) hosts: usize,
}

impl Problem {
    /// A node of its own for every bundle: greedy first, then augmenting paths (Kuhn's
    /// algorithm) for the bundles left over. On failure, returns a set of bundles whose
    /// candidate nodes are fewer than the bundles (Hall's condition fails for it).
    pub(super) fn strict_spread(&self) -> Result<Vec<usize>, Stuck> {
        const FREE: usize = usize::MAX;
        let bundles = self.bundles();
        let candidates: Vec<Vec<usize>> = (0..self.shapes.len())
            .map(|s| {
                (0..self.nodes)
                    .filter(|&n| self.fits(&self.room, n, s))
                    .collect()
            })
            .collect();
        if bundles > self.nodes {
            let hosts = (0..self.nodes)
                .filter(|&n| candidates.iter().any(|c| c.binary_search(&n).is_ok()))
                .count();
            return Err(Stuck {
                bundles: (0..bundles).collect(),
                hosts,
            });
        }
        let mut owner = vec![FREE; self.nodes];
        let mut assigned = vec![FREE; bundles];
        let mut next = vec![0usize; self.shapes.len()];
        for (bundle, slot) in assigned.iter_mut().enumerate() {
            let shape = self.shape_of[bundle];
            let list = &candidates[shape];
            while next[shape] < list.len() && owner[list[next[shape]]] != FREE {
                next[shape] += 1;
            }
            if let Some(&node) = list.get(next[shape]) {
                owner[node] = bundle;
                *slot = node;
            }
        }
        let mut seen = vec![0u32; self.nodes];
        let mut stamp = 0u32;
        for root in 0..bundles {
            if assigned[root] != FREE {
                continue;
            }
            stamp += 1;
            // Depth-first search over alternating paths, without recursion.
            let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
            let mut path: Vec<usize> = Vec::new();
            let mut visited_bundles = vec![root];
            let mut augmented = false;
            while let Some(top) = stack.last_mut() {
                let (bundle, cursor) = *top;
                let list = &candidates[self.shape_of[bundle]];
                if cursor == list.len() {
                    stack.pop();
                    path.pop();
                    continue;
                }
                top.1 += 1;
                let node = list[cursor];
                if seen[node] == stamp {
                    continue;
                }
                seen[node] = stamp;
                path.push(node);
                if owner[node] == FREE {
                    for (&(b, _), &n) in stack.iter().zip(&path) {
                        owner[n] = b;
                        assigned[b] = n;
                    }
                    augmented = true;
                    break;
                }
                visited_bundles.push(owner[node]);
                stack.push((owner[node], 0));
            }
            if !augmented {
                visited_bundles.sort_unstable();
                let hosts = seen.iter().filter(|&&s| s == stamp).count();
                return Err(Stuck {
                    bundles: visited_bundles,
                    hosts,
                });
            }
        }
        Ok(assigned)
    }
}

//! Module circles: files of one crate that import each other in a loop (`a` uses `crate::b`,
//! `b` uses `crate::a`). Such files cannot be read, tested or moved one at a time.
//!
//! Each `.rs` file under a crate's `src/` is a node; `crate::x::y` paths (and a file's own
//! top-level `use super::…`) are edges to the deepest module that is a file. The crate root is
//! left out: re-exports at the root are how modules are meant to meet. Test modules
//! (everything after a file's first `#[cfg(test)]`) are left out too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// How many module circles the workspace may have.
pub(crate) const MAX_CIRCLES: usize = 1;

/// One circle: a crate and the modules (as paths like `executor` or `cgroup::mounts`) in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Circle {
    pub(crate) krate: String,
    pub(crate) modules: Vec<String>,
}

/// Every circle in the workspace at `root` (its `src/`, `crates/*/src/` and `xtask/src/`).
pub(crate) fn workspace_circles(root: &Path) -> Result<Vec<Circle>, String> {
    let mut sources: Vec<(String, PathBuf)> = vec![("trainyard".to_owned(), root.join("src"))];
    let crates = root.join("crates");
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&crates)
        .map_err(|e| format!("cannot read {}: {e}", crates.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for dir in entries {
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        sources.push((name, dir.join("src")));
    }
    sources.push(("xtask".to_owned(), root.join("xtask/src")));
    let mut out = Vec::new();
    for (name, src) in sources.into_iter().filter(|(_, src)| src.is_dir()) {
        let files = rust_files(&src)?;
        for modules in crate_circles(&files) {
            out.push(Circle {
                krate: name.clone(),
                modules,
            });
        }
    }
    Ok(out)
}

/// The circles among one crate's files, given as (path under `src/`, text).
pub(crate) fn crate_circles(files: &[(String, String)]) -> Vec<Vec<String>> {
    let modules: BTreeMap<Vec<String>, &str> = files
        .iter()
        .filter_map(|(path, text)| module_path(path).map(|m| (m, text.as_str())))
        .filter(|(m, _)| !m.is_empty())
        .collect();
    let names: Vec<&Vec<String>> = modules.keys().collect();
    let index: BTreeMap<&Vec<String>, usize> =
        names.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); names.len()];
    for (from, (module, text)) in modules.iter().enumerate() {
        for target in references(module, text) {
            let resolved = (1..=target.len())
                .rev()
                .map(|n| target[..n].to_vec())
                .find(|prefix| modules.contains_key(prefix));
            if let Some(to) = resolved.and_then(|p| index.get(&p).copied())
                && to != from
            {
                edges[from].insert(to);
            }
        }
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| {
            let mut members: Vec<String> = component.iter().map(|&i| names[i].join("::")).collect();
            members.sort();
            members
        })
        .collect()
}

fn rust_files(src: &Path) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                let relative = path.strip_prefix(src).unwrap_or(&path);
                out.push((relative.to_string_lossy().replace('\\', "/"), text));
            }
        }
    }
    Ok(out)
}

/// `a/b.rs` and `a/b/mod.rs` are `[a, b]`; `lib.rs` and `main.rs` the root `[]`; `bin/*` none.
fn module_path(path: &str) -> Option<Vec<String>> {
    let stem = path.strip_suffix(".rs")?;
    if stem.starts_with("bin/") {
        return None;
    }
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    Some(parts)
}

/// The module paths `text` (the file of `module`) names through `crate::` or a top-level
/// `use super::`.
fn references(module: &[String], text: &str) -> Vec<Vec<String>> {
    let body = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = Vec::new();
    for line in body.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let preceded_by_ident = rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$');
            rest = &rest[at + "crate::".len()..];
            if !preceded_by_ident {
                out.extend(paths_at(rest, Vec::new()));
            }
        }
        if let Some(rest) = line
            .strip_prefix("use super::")
            .or_else(|| line.strip_prefix("pub(crate) use super::"))
        {
            let parent = module[..module.len().saturating_sub(1)].to_vec();
            out.extend(paths_at(rest, parent));
        }
    }
    out
}

/// The paths at the start of `rest`: `a::b::C` or a group `{a::b, c}` (one level).
fn paths_at(rest: &str, prefix: Vec<String>) -> Vec<Vec<String>> {
    if let Some(group) = rest.strip_prefix('{') {
        let inner = group.split('}').next().unwrap_or_default();
        return inner
            .split(',')
            .map(|item| {
                let mut path = prefix.clone();
                path.extend(idents(item.trim()));
                path
            })
            .collect();
    }
    let mut path = prefix;
    path.extend(idents(rest));
    vec![path]
}

fn idents(rest: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in rest.split("::") {
        let ident: String = part
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() || ident.len() != part.len() && !part.starts_with(&ident) {
            break;
        }
        out.push(ident.clone());
        if ident.len() != part.len() {
            break;
        }
    }
    out
}

/// Tarjan's strongly connected components.
fn strongly_connected(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.edges[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let n = edges.len();
    let mut state = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if state.index[v].is_none() {
            visit(&mut state, v);
        }
    }
    state.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect()
    }

    #[test]
    fn two_files_that_use_each_other_are_a_circle() {
        let found = crate_circles(&files(&[
            ("lib.rs", "mod a; mod b; pub use a::A;"),
            ("a.rs", "use crate::b::B;\npub struct A;"),
            ("b.rs", "use crate::{a::A, c};\npub struct B;"),
            ("c.rs", "pub fn c() {}"),
        ]));
        assert_eq!(found, vec![vec!["a".to_owned(), "b".to_owned()]]);
    }

    #[test]
    fn a_chain_the_root_and_test_modules_are_no_circle() {
        let found = crate_circles(&files(&[
            ("lib.rs", "mod a; mod b; pub use a::A; pub use b::B;"),
            ("a.rs", "use crate::B;\npub struct A;"),
            (
                "b.rs",
                "pub struct B;\n#[cfg(test)]\nmod tests { use crate::a::A; }",
            ),
        ]));
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn nested_modules_resolve_to_the_deepest_file_and_super() {
        let found = crate_circles(&files(&[
            ("lib.rs", "mod cgroup;"),
            ("cgroup/mod.rs", "mod tree; use crate::cgroup::tree::Tree;"),
            ("cgroup/tree.rs", "use super::Limits;\npub struct Tree;"),
        ]));
        assert_eq!(
            found,
            vec![vec!["cgroup".to_owned(), "cgroup::tree".to_owned()]]
        );
    }

    #[test]
    fn the_workspace_has_at_most_one_circle() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let circles = workspace_circles(&root).expect("the workspace is readable");
        let listed: Vec<String> = circles
            .iter()
            .map(|c| format!("{}: {}", c.krate, c.modules.join(" ⇄ ")))
            .collect();
        println!("{}", listed.join("\n"));
        assert!(
            circles.len() <= MAX_CIRCLES,
            "module circles:\n{}",
            listed.join("\n")
        );
    }
}

//! Module circles: files of one crate that import each other in a loop (`a` uses `crate::b`,
//! `b` uses `crate::a`). Such files cannot be read, tested or moved one at a time.
//!
//! Each `.rs` file under a crate's `src/` is a node; `crate::x::y` paths (and a file's own
//! top-level `use super::…`) are edges to the deepest module that is a file. The crate root is
//! left out: re-exports at the root are how modules are meant to meet. Test modules
//! (everything after a file's first `#[cfg(test)]`) are left out too.
//!
//! The Python package under `python/` is read the same way ([`python_circles`]): each `.py`
//! file is a node, and every `import` of it, at the top or inside a function (both run), is
//! an edge to the deepest module that is a file; imports under `if TYPE_CHECKING:` (which
//! never run) and text in strings are left out, and so is the package's root `__init__.py`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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
    let mut out = python_workspace_circles(&root.join("python"))?;
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
    source_files(src, "rs")
}

/// Every file ending in `.ext` under `src`, as (path under `src`, text).
fn source_files(src: &Path, ext: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
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

/// The circles of the Python packages under `python` (each folder with an `__init__.py`).
fn python_workspace_circles(python: &Path) -> Result<Vec<Circle>, String> {
    if !python.is_dir() {
        return Ok(Vec::new());
    }
    let mut packages: Vec<PathBuf> = std::fs::read_dir(python)
        .map_err(|e| format!("cannot read {}: {e}", python.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.join("__init__.py").is_file())
        .collect();
    packages.sort();
    let mut out = Vec::new();
    for package in packages {
        let name = package
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let files: Vec<(String, String)> = source_files(&package, "py")?
            .into_iter()
            .map(|(path, text)| (format!("{name}/{path}"), text))
            .collect();
        for modules in python_circles(&files) {
            out.push(Circle {
                krate: format!("python/{name}"),
                modules,
            });
        }
    }
    Ok(out)
}

/// The circles among the files of one Python package, given as (path under the folder that
/// holds the package, such as `pkg/sub/mod.py`, and text); modules are named as Python names
/// them (`pkg.sub.mod`, a package by its folder).
pub(crate) fn python_circles(files: &[(String, String)]) -> Vec<Vec<String>> {
    let modules: BTreeMap<String, &str> = files
        .iter()
        .filter_map(|(path, text)| python_module(path).map(|m| (m, text.as_str())))
        .collect();
    let packages: BTreeSet<&str> = files
        .iter()
        .filter_map(|(path, _)| path.strip_suffix("/__init__.py"))
        .collect();
    // The package's root `__init__.py`, where its public names meet, is no node.
    let root = files
        .iter()
        .filter_map(|(path, _)| path.strip_suffix("/__init__.py"))
        .filter(|dir| !dir.contains('/'))
        .map(|dir| dir.replace('/', "."))
        .collect::<BTreeSet<_>>();
    let names: Vec<&String> = modules.keys().filter(|m| !root.contains(*m)).collect();
    let index: BTreeMap<&String, usize> = names.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); names.len()];
    for (from, module) in names.iter().enumerate() {
        let is_package = packages.contains(module.replace('.', "/").as_str());
        for target in python_imports(module, is_package, modules[*module]) {
            let resolved = python_resolve(&target, &modules);
            if let Some(to) = resolved.as_ref().and_then(|m| index.get(m).copied())
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
            let mut members: Vec<String> = component.iter().map(|&i| names[i].clone()).collect();
            members.sort();
            members
        })
        .collect()
}

/// `pkg/sub/mod.py` is `pkg.sub.mod`, `pkg/sub/__init__.py` is `pkg.sub`.
fn python_module(path: &str) -> Option<String> {
    let stem = path.strip_suffix(".py")?;
    let stem = stem.strip_suffix("/__init__").unwrap_or(stem);
    Some(stem.replace('/', "."))
}

/// The deepest module of `target` (`a.b.c`, or `a.b` + a name imported from it) that is a
/// file.
fn python_resolve(target: &str, modules: &BTreeMap<String, &str>) -> Option<String> {
    let parts: Vec<&str> = target.split('.').collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("."))
        .find(|name| modules.contains_key(name))
}

/// What the file of `module` imports, as dotted names: `import a.b` gives `a.b`, `from a.b
/// import c, d` gives `a.b.c` and `a.b.d` (each resolved to the deepest module that is a
/// file, so a name that is no module stands for `a.b`), relative imports made absolute.
/// Lines in strings and under `if TYPE_CHECKING:` are passed over.
fn python_imports(module: &str, is_package: bool, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_string: Option<&str> = None;
    let mut skip_deeper_than: Option<usize> = None;
    let mut lines = text.lines().peekable();
    while let Some(raw) = lines.next() {
        let code = raw.split('#').next().unwrap_or_default();
        let trimmed = code.trim_start();
        let indent = code.len() - trimmed.len();
        if let Some(quote) = in_string {
            if code.matches(quote).count() % 2 == 1 {
                in_string = None;
            }
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        if let Some(depth) = skip_deeper_than {
            if indent > depth {
                continue;
            }
            skip_deeper_than = None;
        }
        for quote in ["\"\"\"", "'''"] {
            if code.matches(quote).count() % 2 == 1 {
                in_string = Some(quote);
            }
        }
        let statement = trimmed.trim_end();
        if statement == "if TYPE_CHECKING:"
            || statement.starts_with("if TYPE_CHECKING:  ")
            || statement == "if typing.TYPE_CHECKING:"
        {
            skip_deeper_than = Some(indent);
            continue;
        }
        if let Some(rest) = statement.strip_prefix("import ") {
            for item in rest.split(',') {
                let name = item.split_whitespace().next().unwrap_or_default();
                if !name.is_empty() {
                    out.push(name.to_owned());
                }
            }
        } else if let Some(rest) = statement.strip_prefix("from ") {
            let Some((from, names)) = rest.split_once(" import ") else {
                continue;
            };
            let mut names = names.trim().to_owned();
            if names.starts_with('(') {
                while !names.contains(')') {
                    match lines.next() {
                        Some(more) => {
                            names.push(' ');
                            names.push_str(more.split('#').next().unwrap_or_default());
                        }
                        None => break,
                    }
                }
            }
            let base = python_absolute(module, is_package, from.trim());
            let Some(base) = base else {
                continue;
            };
            for item in names
                .trim_matches(|c| c == '(' || c == ')' || c == ' ')
                .split(',')
            {
                let name = item.split_whitespace().next().unwrap_or_default();
                if name.is_empty() || name == "*" {
                    out.push(base.clone());
                } else {
                    out.push(format!("{base}.{name}"));
                }
            }
        }
    }
    out
}

/// `from` made absolute for the file of `module`: `.x` is a sibling, `..x` one level up.
fn python_absolute(module: &str, is_package: bool, from: &str) -> Option<String> {
    let dots = from.chars().take_while(|c| *c == '.').count();
    if dots == 0 {
        return Some(from.to_owned());
    }
    let mut parts: Vec<&str> = module.split('.').collect();
    let up = if is_package { dots - 1 } else { dots };
    if up >= parts.len() {
        return None;
    }
    parts.truncate(parts.len() - up);
    let rest = &from[dots..];
    if !rest.is_empty() {
        parts.push(rest);
    }
    Some(parts.join("."))
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
    fn python_files_that_import_each_other_are_a_circle_even_inside_functions() {
        let found = python_circles(&files(&[
            ("pkg/__init__.py", "from pkg import a\n"),
            ("pkg/a.py", "from pkg.sub import f\n"),
            (
                "pkg/sub/__init__.py",
                "def f():\n    from pkg import a\n    return a\n",
            ),
            ("pkg/sub/helper.py", "import os\n"),
            ("pkg/c.py", "from . import a\nfrom .a import thing\n"),
        ]));
        assert_eq!(found, vec![vec!["pkg.a".to_owned(), "pkg.sub".to_owned()]]);
    }

    #[test]
    fn python_imports_in_strings_or_for_type_checkers_and_the_root_are_no_circle() {
        let found = python_circles(&files(&[
            (
                "pkg/__init__.py",
                "from pkg.a import A\nfrom pkg.b import B\n",
            ),
            (
                "pkg/a.py",
                "\"\"\"Use it so::\n\n    from pkg.b import B\n\"\"\"\nfrom typing import TYPE_CHECKING\n\
                 if TYPE_CHECKING:\n    from pkg.b import B\n\nimport pkg\nclass A: ...\n",
            ),
            (
                "pkg/b.py",
                "from pkg.a import (\n    A,\n)\nclass B(A): ...\n",
            ),
        ]));
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn relative_python_imports_resolve_from_the_file_and_its_package() {
        let found = python_circles(&files(&[
            ("pkg/__init__.py", ""),
            ("pkg/sub/__init__.py", "from .mod import x\n"),
            ("pkg/sub/mod.py", "from .. import other\n"),
            ("pkg/other.py", "from pkg.sub import mod\n"),
        ]));
        assert_eq!(
            found,
            vec![vec!["pkg.other".to_owned(), "pkg.sub.mod".to_owned()]]
        );
    }

    #[test]
    fn the_workspace_has_no_circle() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let circles = workspace_circles(&root).expect("the workspace is readable");
        let listed: Vec<String> = circles
            .iter()
            .map(|c| format!("{}: {}", c.krate, c.modules.join(" ⇄ ")))
            .collect();
        println!("{}", listed.join("\n"));
        assert!(circles.is_empty(), "module circles:\n{}", listed.join("\n"));
    }
}

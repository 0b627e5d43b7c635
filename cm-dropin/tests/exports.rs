//! The drop-in library defines every public symbol of rdma-core v44's librdmacm and libibverbs
//! (`public-symbols.txt`), so that no program dies in the loader on one it imports
//! ("symbol lookup error: undefined symbol"), and defines the version nodes they come in.
//!
//! The symbols are read from the built library's dynamic symbol table with `nm -D` (binutils,
//! which the C toolchain that links the library brings).

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const RUN: &str = env!("CARGO_BIN_EXE_cmsim-run");

/// The built drop-in library, laid out by `cmsim-run` as the programs load it.
fn library() -> PathBuf {
    let out = Command::new(RUN)
        .arg("--print-lib-dir")
        .output()
        .expect("run cmsim-run --print-lib-dir");
    assert!(
        out.status.success(),
        "cmsim-run --print-lib-dir: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = String::from_utf8(out.stdout).expect("a UTF-8 directory");
    Path::new(dir.trim()).join("libibverbs.so.1")
}

/// The checked-in list: (version node, symbol) in the maps' order.
fn public_symbols() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("public-symbols.txt");
    let text = std::fs::read_to_string(&path).expect("read public-symbols.txt");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            let (Some(node), Some(sym), None) = (w.next(), w.next(), w.next()) else {
                panic!("public-symbols.txt: not \"NODE symbol\": {l:?}");
            };
            (node.to_string(), sym.to_string())
        })
        .collect()
}

/// `nm -D --defined-only` of `lib`: each defined symbol's type letter and name (with its
/// `@VERSION` or `@@VERSION` where it has one).
fn dynamic_symbols(lib: &Path) -> Vec<(char, String)> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .unwrap_or_else(|e| panic!("run nm (binutils) on {}: {e}", lib.display()));
    assert!(
        out.status.success(),
        "nm {}: {}",
        lib.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (_addr, kind, name) = (w.next()?, w.next()?, w.next()?);
            Some((kind.chars().next()?, name.to_string()))
        })
        .collect()
}

/// The names in the list that are variables, not functions (libibverbs' `.bss`).
const VARIABLES: [&str; 1] = ["verbs_allow_disassociate_destroy"];

#[test]
fn every_public_symbol_of_librdmacm_and_libibverbs_is_exported() {
    let list = public_symbols();
    let names: BTreeSet<&str> = list.iter().map(|(_, s)| s.as_str()).collect();
    // rdma-core v44's maps name 147 distinct public symbols (180 node/symbol pairs) and 72 in
    // the private node: a list that lost some would pass the check below without them.
    assert_eq!(
        (list.len(), names.len()),
        (252, 219),
        "public-symbols.txt is not v44's list"
    );
    let lib = library();
    let defined = dynamic_symbols(&lib);
    let of_kind = |kinds: &[char]| -> HashSet<String> {
        defined
            .iter()
            .filter(|(kind, _)| kinds.contains(kind))
            .map(|(_, name)| name.clone())
            .collect()
    };
    let (functions, variables) = (of_kind(&['T']), of_kind(&['B', 'D']));
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|s| {
            if VARIABLES.contains(s) {
                !variables.contains(*s)
            } else {
                !functions.contains(*s)
            }
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} does not export (as a function or variable at the base version) {} public symbols: {missing:?}",
        lib.display(),
        missing.len()
    );
}

#[test]
fn every_version_node_of_the_public_symbols_is_defined() {
    let nodes: BTreeSet<String> = public_symbols().into_iter().map(|(n, _)| n).collect();
    let lib = library();
    let out = Command::new("readelf")
        .args(["-V", "-W"])
        .arg(&lib)
        .output()
        .expect("run readelf (binutils)");
    assert!(out.status.success(), "readelf -V {}", lib.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let defined: HashSet<&str> = text
        .split("Version needs")
        .next()
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split("Name: ").nth(1))
        .map(str::trim)
        .collect();
    let missing: Vec<&String> = nodes.iter().filter(|n| !defined.contains(n.as_str())).collect();
    assert!(
        missing.is_empty(),
        "{} lacks the version nodes {missing:?}: a binary that needs one is refused by the loader",
        lib.display()
    );
}

/// rdma-core's own libraries where the distribution puts them, when they are v44.
fn installed_rdma_core_v44() -> Option<Vec<PathBuf>> {
    let dirs = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"];
    let mut libs = Vec::new();
    for (name, version) in [("libibverbs.so.1", "1.14.44.0"), ("librdmacm.so.1", "1.3.44.0")] {
        let real = dirs
            .iter()
            .find_map(|d| std::fs::canonicalize(Path::new(d).join(name)).ok());
        match real {
            Some(p) if p.to_string_lossy().ends_with(version) => libs.push(p),
            other => {
                eprintln!(
                    "skipped: rdma-core v44's {name} is not installed (found {other:?}; apt-get install libibverbs1 librdmacm1 of v44)"
                );
                return None;
            }
        }
    }
    Some(libs)
}

#[test]
fn the_list_holds_every_public_symbol_that_rdma_core_v44_exports() {
    let Some(libs) = installed_rdma_core_v44() else {
        return;
    };
    let list: BTreeSet<(String, String)> = public_symbols().into_iter().collect();
    let mut exported = BTreeSet::new();
    for lib in &libs {
        for (kind, name) in dynamic_symbols(lib) {
            let Some((sym, node)) = name.split_once('@') else {
                continue;
            };
            let node = node.trim_start_matches('@');
            if kind == 'T' || (kind == 'B' && VARIABLES.contains(&sym)) {
                exported.insert((node.to_string(), sym.to_string()));
            }
        }
    }
    let unlisted: Vec<_> = exported.difference(&list).collect();
    assert!(
        unlisted.is_empty(),
        "exported by {libs:?} but not in public-symbols.txt: {unlisted:?}"
    );
    // What the maps name but the libraries do not define: the headers' inline functions, and
    // a helper the private node still names that v44's libibverbs dropped.
    let undefined: Vec<_> = list.difference(&exported).map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        undefined,
        [
            "ibv_query_device_ex",
            "ibv_cmd_query_device",
            "rdma_get_local_addr",
            "rdma_get_peer_addr"
        ],
        "public-symbols.txt names symbols rdma-core v44 neither exports nor inlines"
    );
}

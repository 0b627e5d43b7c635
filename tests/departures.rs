//! The differential suite's list of known departures (`tests/differential-departures.txt`)
//! checked against the README's departures section: every entry cites an item of that section
//! ("README N: ...") that exists and speaks of the entry's call, and the section points at the
//! list.
#![allow(unreachable_pub)]

const README: &str = include_str!("../README.md");
const LIST: &str = include_str!("differential-departures.txt");

/// The numbered items of the README's departures section, by number.
fn readme_departures() -> Vec<(u32, String)> {
    let start = README
        .find("## Where this project departs from librdmacm")
        .expect("README has a departures section");
    let section = &README[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    let mut items: Vec<(u32, String)> = Vec::new();
    for line in section[..end].lines() {
        let trimmed = line.trim_start();
        let number = trimmed
            .split_once(". ")
            .filter(|_| line.len() == trimmed.len())
            .and_then(|(n, _)| n.parse::<u32>().ok());
        match (number, items.last_mut()) {
            (Some(n), _) => items.push((n, trimmed.to_string())),
            (None, Some((_, text))) if line.starts_with("   ") || line.starts_with("    ") => {
                text.push(' ');
                text.push_str(trimmed);
            }
            _ => {}
        }
    }
    items
}

/// The list's entries: (state, call, column, outcome, reason).
fn entries() -> Vec<[String; 5]> {
    LIST.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (key, reason) = l.split_once('|').unwrap_or_else(|| panic!("no `| reason`: {l}"));
            let f: Vec<&str> = key.split_whitespace().collect();
            assert_eq!(f.len(), 4, "`state call column outcome | reason`: {l}");
            [f[0], f[1], f[2], f[3], reason.trim()].map(str::to_string)
        })
        .collect()
}

#[test]
fn readme_departures_are_numbered_in_order() {
    let items = readme_departures();
    assert!(items.len() >= 10, "found {} items", items.len());
    for (i, (n, _)) in items.iter().enumerate() {
        assert_eq!(
            *n as usize,
            i + 1,
            "README departure items are numbered 1, 2, ..."
        );
    }
}

#[test]
fn every_listed_departure_cites_a_readme_item_that_names_its_call() {
    let items = readme_departures();
    for [state, call, column, _, reason] in entries() {
        assert!(
            column == "librdmacm" || column == "simulator",
            "{state} {call}: column is librdmacm or simulator, not {column}"
        );
        let cited = reason
            .strip_prefix("README ")
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or_else(|| panic!("{state} {call}: the reason starts with `README N:`: {reason}"));
        let (_, text) = items
            .iter()
            .find(|(n, _)| *n == cited)
            .unwrap_or_else(|| panic!("{state} {call}: README has no departure {cited}"));
        if call != "*" {
            assert!(
                text.contains(&format!("`{call}`")) || text.contains(&format!("`rdma_{call}")),
                "{state} {call}: README departure {cited} does not name `{call}`: {text}"
            );
        }
    }
}

#[test]
fn readme_departures_section_points_at_the_measured_list() {
    let start = README
        .find("## Where this project departs from librdmacm")
        .unwrap();
    assert!(
        README[start..].contains("tests/differential-departures.txt"),
        "the README's departures section names the differential suite's list"
    );
}

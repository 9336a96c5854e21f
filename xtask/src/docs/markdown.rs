//! Just enough Markdown reading for the docs check: headings and their GitHub anchors,
//! relative links, table rows and the code spans in a cell. Fenced code blocks are
//! skipped throughout: what a shell session prints is not documentation of a name.

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
pub fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// GitHub's anchor for a heading's text: lower case, spaces to `-`, punctuation other than
/// `-` and `_` dropped.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of every heading of `text`, with GitHub's `-1`, `-2` … for repeats.
pub fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, line) in prose_lines(text) {
        let Some(rest) = line.strip_prefix('#') else {
            continue;
        };
        let base = anchor(rest.trim_start_matches('#'));
        let repeats = out
            .iter()
            .filter(|a| **a == base || a.strip_prefix(&format!("{base}-")).is_some_and(is_digits))
            .count();
        out.push(if repeats == 0 {
            base
        } else {
            format!("{base}-{repeats}")
        });
    }
    out
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())
}

/// A link of a Markdown file: its line and its target as written.
#[derive(Debug, PartialEq, Eq)]
pub struct Link {
    pub line: usize,
    pub target: String,
}

/// The `[text](target)` links of `text` whose target is not a URL (`scheme:`), outside
/// code blocks and code spans.
pub fn relative_links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].trim();
            let is_url = target
                .split_once(':')
                .is_some_and(|(scheme, _)| scheme.chars().all(|c| c.is_ascii_alphabetic()));
            if !target.is_empty() && !is_url {
                out.push(Link {
                    line: n,
                    target: target.to_string(),
                });
            }
            rest = &after[end..];
        }
    }
    out
}

/// `line` with every code span blanked out (its backticks kept).
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(c);
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The cells of every table row of `text` (header rows too, separator rows not), split
/// on `|` that is not escaped as `\|`.
pub fn table_rows(text: &str) -> Vec<Vec<String>> {
    prose_lines(text)
        .into_iter()
        .filter_map(|(_, line)| table_row(line))
        .collect()
}

/// The table rows of the section under the heading whose text is `heading` (up to the
/// next heading of the same or a higher level).
pub fn section_rows(text: &str, heading: &str) -> Option<Vec<Vec<String>>> {
    let lines = prose_lines(text);
    let start = lines
        .iter()
        .position(|(_, l)| l.starts_with('#') && l.trim_start_matches('#').trim() == heading)?;
    let level = lines[start].1.chars().take_while(|c| *c == '#').count();
    Some(
        lines[start + 1..]
            .iter()
            .take_while(|(_, l)| {
                !l.starts_with('#') || l.chars().take_while(|c| *c == '#').count() > level
            })
            .filter_map(|(_, l)| table_row(l))
            .collect(),
    )
}

fn table_row(line: &str) -> Option<Vec<String>> {
    let line = line.trim();
    let inner = line.strip_prefix('|')?.strip_suffix('|')?;
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cell).trim().to_string()),
            c => cell.push(c),
        }
    }
    cells.push(cell.trim().to_string());
    let separator = cells
        .iter()
        .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':' | ' ')));
    (!separator).then_some(cells)
}

/// The contents of the code spans of `cell`.
pub fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Escapes a table cell's `|` and folds its line breaks.
pub fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_follow_github() {
        assert_eq!(
            anchor(" Trace simulation: `kubectl tessera simulate`"),
            "trace-simulation-kubectl-tessera-simulate"
        );
        assert_eq!(
            anchors("# A\n## B c\n```\n# not a heading\n```\n## B c\n"),
            ["a", "b-c", "b-c-1"]
        );
    }

    #[test]
    fn links_skip_urls_code_and_code_spans() {
        let text =
            "see [a](b.md#x) and [u](https://x.y) `[no](c.md)`\n```\n[no](d.md)\n```\n[e](../e.md)";
        let links: Vec<String> = relative_links(text).into_iter().map(|l| l.target).collect();
        assert_eq!(links, ["b.md#x", "../e.md"]);
    }

    #[test]
    fn table_cells_keep_escaped_pipes() {
        let rows = table_rows("| a | b |\n|---|---|\n| `x\\|y` | z |\n");
        assert_eq!(rows, [vec!["a", "b"], vec!["`x|y`", "z"]]);
        assert_eq!(code_spans("`a`, `b` and c"), ["a", "b"]);
    }

    #[test]
    fn a_section_ends_at_the_next_heading_of_its_level() {
        let text = "## One\n| a |\n### Sub\n| b |\n## Two\n| c |\n";
        assert_eq!(section_rows(text, "One").unwrap(), [vec!["a"], vec!["b"]]);
        assert_eq!(section_rows(text, "Two").unwrap(), [vec!["c"]]);
        assert!(section_rows(text, "Three").is_none());
    }
}

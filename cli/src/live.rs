//! What the commands share: a runtime of their own (the CLI is synchronous), the output
//! formats every command takes, and tables.

use std::{future::Future, io::Write};

use anyhow::Context;
use comfy_table::{ContentArrangement, Table, presets};
use serde::Serialize;

/// Output format (`-o`), as kubectl names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// For a person: a table, or a picture where a table cannot say it.
    #[default]
    Table,
    /// The table with more columns.
    Wide,
    /// JSON (a list is always a JSON array).
    Json,
    /// YAML (a list is always a YAML sequence).
    Yaml,
}

impl Output {
    /// Whether the person asked for the wide form.
    pub fn wide(self) -> bool {
        self == Output::Wide
    }
}

/// Runs `read` to completion on a runtime of its own.
pub fn block_on<T>(read: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(read)
}

/// Prints `view` as JSON or YAML, or as `table` draws it (told whether to be wide).
pub fn print<T: Serialize + ?Sized>(
    out: &mut dyn Write,
    output: Output,
    view: &T,
    table: impl FnOnce(&mut dyn Write, &T, bool) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    match output {
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, view)?;
            writeln!(out)?;
        }
        Output::Yaml => write!(out, "{}", serde_yaml::to_string(view)?)?,
        Output::Table | Output::Wide => table(out, view, output.wide())?,
    }
    Ok(())
}

/// A table as kubectl prints one: a header of capitals, no borders, columns as wide as
/// their longest cell, never wrapped.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|h| h.to_uppercase()));
    for i in 0..header.len() {
        if let Some(c) = t.column_mut(i) {
            // kubectl separates columns by three spaces and pads nothing on the left.
            c.set_padding((0, 3));
        }
    }
    t
}

/// Writes `t` with no trailing spaces.
pub fn write_table(out: &mut dyn Write, t: &Table) -> std::io::Result<()> {
    for line in t.lines() {
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_whatever_the_cell_width() {
        let mut t = table(&["index", "product", "memory"]);
        t.add_row([
            "0",
            "NVIDIA H100 80GB HBM3 with a much longer name",
            "81559 MiB",
        ]);
        t.add_row(["1", "NVIDIA L4", "23034 MiB"]);
        let mut out = Vec::new();
        write_table(&mut out, &t).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("INDEX   PRODUCT"), "{text}");
        let at = |l: &str| l.find("MiB").or_else(|| l.find("MEMORY"));
        assert_eq!(at(lines[0]), lines[1].find("81559"), "{text}");
        assert_eq!(lines[1].find("81559"), lines[2].find("23034"), "{text}");
    }

    #[test]
    fn yaml_and_json_print_the_same_value() {
        let v = vec![serde_json::json!({"a": 1})];
        let mut json = Vec::new();
        print(&mut json, Output::Json, &v, |_, _, _| Ok(())).unwrap();
        let mut yaml = Vec::new();
        print(&mut yaml, Output::Yaml, &v, |_, _, _| Ok(())).unwrap();
        let a: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let b: serde_json::Value = serde_yaml::from_slice(&yaml).unwrap();
        assert_eq!(a, b);
        assert!(a.is_array());
    }
}

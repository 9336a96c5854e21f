//! Parsers of the workload inputs: the Alibaba openb trace ([`openb`]) and Tessera's own
//! CSV ([`csv`]). Pure: they take the text and a label for errors; reading files is the
//! caller's business.

pub mod csv;
pub mod openb;

/// A bad input, naming the source and the line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InputError {
    /// The input has no header line.
    #[error("{source_name}: empty input, expected a header line")]
    Empty {
        /// The file (or label) the text came from.
        source_name: String,
    },
    /// A column the format needs is missing from the header.
    #[error("{source_name}: the header has no {column:?} column (found: {found})")]
    MissingColumn {
        /// Source label.
        source_name: String,
        /// The missing column.
        column: &'static str,
        /// The header as read.
        found: String,
    },
    /// A line has fewer fields than the header.
    #[error("{source_name} line {line}: {found} fields, the header has {expected}")]
    FieldCount {
        /// Source label.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// Fields in the header.
        expected: usize,
        /// Fields on the line.
        found: usize,
    },
    /// A field does not parse or is out of range.
    #[error("{source_name} line {line}: {column} = {value:?}: {reason}")]
    Field {
        /// Source label.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// Column name.
        column: &'static str,
        /// The field as read.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A line is not of a kind the format knows.
    #[error("{source_name} line {line}: {reason}")]
    Line {
        /// Source label.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// A header's column positions.
pub(crate) struct Header<'a> {
    source_name: &'a str,
    names: Vec<&'a str>,
}

impl<'a> Header<'a> {
    pub(crate) fn new(source_name: &'a str, line: &'a str) -> Self {
        Self {
            source_name,
            names: line.split(',').map(str::trim).collect(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// The position of `column`, or an error naming it.
    pub(crate) fn index(&self, column: &'static str) -> Result<usize, InputError> {
        self.names
            .iter()
            .position(|n| *n == column)
            .ok_or_else(|| InputError::MissingColumn {
                source_name: self.source_name.to_string(),
                column,
                found: self.names.join(","),
            })
    }

    /// The position of `column` when the header has it.
    pub(crate) fn optional(&self, column: &str) -> Option<usize> {
        self.names.iter().position(|n| *n == column)
    }
}

/// One data line split into fields, with what errors need to name it.
pub(crate) struct Fields<'a> {
    source_name: &'a str,
    line: usize,
    fields: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    /// Splits `text` (line `line`, 1-based) and checks it has at least `expected` fields.
    pub(crate) fn split(
        source_name: &'a str,
        line: usize,
        text: &'a str,
        expected: usize,
    ) -> Result<Self, InputError> {
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.len() < expected {
            return Err(InputError::FieldCount {
                source_name: source_name.to_string(),
                line,
                expected,
                found: fields.len(),
            });
        }
        Ok(Self {
            source_name,
            line,
            fields,
        })
    }

    pub(crate) fn text(&self, i: usize) -> &'a str {
        self.fields.get(i).copied().unwrap_or("")
    }

    pub(crate) fn error(&self, column: &'static str, i: usize, reason: &str) -> InputError {
        InputError::Field {
            source_name: self.source_name.to_string(),
            line: self.line,
            column,
            value: self.text(i).to_string(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn line_error(&self, reason: String) -> InputError {
        InputError::Line {
            source_name: self.source_name.to_string(),
            line: self.line,
            reason,
        }
    }

    /// A non-negative integer field.
    pub(crate) fn u64(&self, column: &'static str, i: usize) -> Result<u64, InputError> {
        self.text(i)
            .parse()
            .map_err(|_| self.error(column, i, "not a non-negative integer"))
    }

    /// A non-negative integer field that may be empty.
    pub(crate) fn optional_u64(
        &self,
        column: &'static str,
        i: usize,
    ) -> Result<Option<u64>, InputError> {
        if self.text(i).is_empty() {
            return Ok(None);
        }
        self.u64(column, i).map(Some)
    }

    pub(crate) fn u32(&self, column: &'static str, i: usize) -> Result<u32, InputError> {
        self.text(i)
            .parse()
            .map_err(|_| self.error(column, i, "not a non-negative integer"))
    }
}

/// Data lines of `text` with their 1-based numbers: blank lines and `#` comments skipped.
pub(crate) fn data_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
}

/// Checks a pod's GPU fields together: a CPU pod asks no share, a GPU pod a share in
/// 1..=1000, and a pod of several GPUs whole GPUs (the trace's convention: a share is
/// of one GPU).
pub(crate) fn check_gpu_fields(
    fields: &Fields<'_>,
    gpus: u32,
    milli: u32,
    milli_index: usize,
) -> Result<(), InputError> {
    let reason = match (gpus, milli) {
        (0, 0) => return Ok(()),
        (0, _) => "a pod without GPUs asks no GPU share",
        (_, 0) => "a pod with GPUs needs a share of 1..=1000",
        (_, m) if m > crate::workload::WHOLE_GPU_MILLI => "a GPU share is at most 1000",
        (g, m) if g > 1 && m != crate::workload::WHOLE_GPU_MILLI => {
            "a pod of several GPUs asks for whole GPUs (1000)"
        }
        _ => return Ok(()),
    };
    Err(fields.error("gpu_milli", milli_index, reason))
}

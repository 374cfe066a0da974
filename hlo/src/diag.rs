//! Diagnostics: every error about input names the file, line and column, shows the offending line with a caret under
//! it, and says what was expected.

use std::fmt;

use crate::ir::{InstrId, Module, Span};

/// What stage found the problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed text (lexing or syntax).
    Parse,
    /// Well-formed text or proto that breaks a shape or structure rule.
    Verify,
    /// Binary `HloModuleProto` that cannot be decoded.
    Proto,
    /// Input Peerless understands but does not support (op, dtype, attribute).
    Unsupported,
    /// A parameter's sharding annotation that cannot be read, or that does not fit its value or the device count
    /// (`sharding/`).
    Sharding,
}

/// An error about an HLO module, with its location when one is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub file: String,
    /// 1-based; 0 when the location is unknown (e.g. proto input).
    pub line: u32,
    pub col: u32,
    pub message: String,
    /// The text of the offending line, for the caret display.
    pub source_line: Option<String>,
    pub caret_len: u32,
    /// The instruction the error is about, when an analysis of a verified module raised it ([`Error::about`]), so that
    /// a consumer can name it in its own words.
    pub instr: Option<InstrId>,
}

impl Error {
    /// An error at `span` of `src` (the whole source text of `file`).
    pub fn at(kind: ErrorKind, file: &str, src: &str, span: Span, message: impl Into<String>) -> Self {
        Error::located(kind, file, span, message).with_source(src)
    }

    /// An error at `span`, without the line's text (see [`Error::with_source`]).
    pub(crate) fn located(kind: ErrorKind, file: &str, span: Span, message: impl Into<String>) -> Self {
        Error {
            kind,
            file: file.to_owned(),
            line: span.line,
            col: span.col,
            message: message.into(),
            source_line: None,
            caret_len: span.len.max(1),
            instr: None,
        }
    }

    /// Fills in the offending line from `src` when the error has a location but no line text yet (verifier errors are
    /// raised without access to the source).
    pub fn with_source(mut self, src: &str) -> Self {
        if self.line > 0 && self.source_line.is_none() {
            self.source_line = src.lines().nth(self.line as usize - 1).map(str::to_owned);
        }
        self
    }

    /// An error with no source location.
    pub fn new(kind: ErrorKind, file: &str, message: impl Into<String>) -> Self {
        Error::located(kind, file, Span::default(), message)
    }

    /// An error about instruction `id` of `m` (an analysis's finding, not a parse error): located at the instruction's
    /// name when it was parsed from text, its message `%name in computation: why`, and [`Error::instr`] set.
    pub fn about(kind: ErrorKind, m: &Module, id: InstrId, why: impl fmt::Display) -> Self {
        let span = m.instrs.get(id).and_then(|i| i.span).unwrap_or_default();
        Error { instr: Some(id), ..Error::located(kind, &m.source_name, span, format!("{}: {why}", m.describe(id))) }
    }

    /// The message without the `%name in computation: ` that [`Error::about`] puts first (the whole message for other
    /// errors): for consumers that name the instruction themselves. `m` is the module the error is about.
    pub fn reason(&self, m: &Module) -> &str {
        self.instr
            .and_then(|id| self.message.strip_prefix(&m.describe(id)))
            .and_then(|rest| rest.strip_prefix(": "))
            .unwrap_or(&self.message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ErrorKind::Parse => "parse error",
            ErrorKind::Verify => "invalid module",
            ErrorKind::Proto => "invalid HloModuleProto",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Sharding => "invalid sharding",
        };
        if self.line > 0 {
            write!(f, "{}:{}:{}: {}: {}", self.file, self.line, self.col, what, self.message)?;
        } else {
            write!(f, "{}: {}: {}", self.file, what, self.message)?;
        }
        if let Some(line) = &self.source_line {
            // Tabs keep their width so the caret lines up under the text.
            let pad: String = line
                .chars()
                .take(self.col.saturating_sub(1) as usize)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            let shown: String = line.chars().take(200).collect();
            write!(f, "\n  | {shown}\n  | {pad}{}", "^".repeat(self.caret_len.min(80) as usize))?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

//! Lexing primitives over the raw source: trivia (whitespace and comments), identifiers, integers, quoted strings,
//! balanced raw values, and diagnostics that point at a byte range of the source.
//!
//! The cursor never panics: every read goes through `get`, and positions only ever stop on ASCII bytes (or the end), so
//! slicing `src` at them is safe.

use crate::{Error, ErrorKind, Span};

pub(crate) type PResult<T> = Result<T, Error>;

/// Maximum nesting depth of shapes, literals, shardings and raw values.
pub(crate) const MAX_DEPTH: u32 = 64;

/// A read position in HLO text, with the helpers every sub-parser shares.
pub(crate) struct Cursor<'a> {
    pub file: &'a str,
    pub src: &'a str,
    b: &'a [u8],
    pub pos: usize,
    line_starts: Vec<usize>,
    /// Start of a `/*` comment with no closing `*/` (the cursor then sits at the end).
    bad_comment: Option<usize>,
}

pub fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

pub fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-')
}

impl<'a> Cursor<'a> {
    pub fn new(file: &'a str, src: &'a str) -> Self {
        let b = src.as_bytes();
        let mut line_starts = vec![0];
        line_starts.extend(b.iter().enumerate().filter(|(_, c)| **c == b'\n').map(|(i, _)| i + 1));
        Cursor { file, src, b, pos: 0, line_starts, bad_comment: None }
    }

    /// The byte at `pos`, without skipping trivia.
    pub fn raw_peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    pub fn byte_at(&self, i: usize) -> Option<u8> {
        self.b.get(i).copied()
    }

    /// `src[start..end]`, or "" when the range is not valid.
    pub fn slice(&self, start: usize, end: usize) -> &'a str {
        self.src.get(start..end).unwrap_or("")
    }

    /// Skips whitespace, `// line` comments and `/* block */` comments.
    pub fn ws(&mut self) {
        loop {
            match self.raw_peek() {
                Some(b' ' | b'\t' | b'\r' | b'\n') => self.pos += 1,
                Some(b'/') if self.byte_at(self.pos + 1) == Some(b'/') => {
                    while let Some(c) = self.raw_peek() {
                        if c == b'\n' {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                Some(b'/') if self.byte_at(self.pos + 1) == Some(b'*') => {
                    let rest = self.b.get(self.pos + 2..).unwrap_or(&[]);
                    match rest.windows(2).position(|w| w == b"*/") {
                        Some(i) => self.pos += 2 + i + 2,
                        None => {
                            self.bad_comment.get_or_insert(self.pos);
                            self.pos = self.b.len();
                        }
                    }
                }
                _ => break,
            }
        }
    }

    /// The next significant byte (after trivia).
    pub fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.raw_peek()
    }

    pub fn at_eof(&mut self) -> bool {
        self.peek().is_none()
    }

    /// Consumes `c` if it is the next significant byte.
    pub fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Consumes `s` if the significant text starts with it.
    pub fn eat_str(&mut self, s: &str) -> bool {
        self.ws();
        if self.b.get(self.pos..).is_some_and(|r| r.starts_with(s.as_bytes())) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    /// Consumes the keyword `kw` if the next identifier is exactly it.
    pub fn eat_kw(&mut self, kw: &str) -> bool {
        let save = self.pos;
        match self.ident() {
            Some((_, s)) if s == kw => true,
            _ => {
                self.pos = save;
                false
            }
        }
    }

    /// Requires byte `c`; `what` says where (e.g. "to close the operand list").
    pub fn expect(&mut self, c: u8, what: &str) -> PResult<()> {
        if self.eat(c) { Ok(()) } else { Err(self.err_found(&format!("expected '{}' {what}", c as char))) }
    }

    /// The rest of a list whose opener was just read: items separated by ',' up to `close` (none when `close` comes at
    /// once), `item` reading item number `i`; a missing `close` is "expected '<close>' `closing`".
    pub fn list<T>(
        &mut self,
        close: u8,
        closing: &str,
        mut item: impl FnMut(&mut Self, usize) -> PResult<T>,
    ) -> PResult<Vec<T>> {
        let mut v = Vec::new();
        if self.eat(close) {
            return Ok(v);
        }
        loop {
            v.push(item(self, v.len())?);
            if !self.eat(b',') {
                self.expect(close, closing)?;
                return Ok(v);
            }
        }
    }

    /// An identifier `[A-Za-z_][A-Za-z0-9_.-]*`.
    pub fn ident(&mut self) -> Option<(usize, &'a str)> {
        self.ws();
        let start = self.pos;
        if !self.raw_peek().is_some_and(is_ident_start) {
            return None;
        }
        while self.raw_peek().is_some_and(is_ident_char) {
            self.pos += 1;
        }
        Some((start, self.slice(start, self.pos)))
    }

    /// An identifier, or the error "`msg`, found X".
    pub fn expect_ident(&mut self, msg: &str) -> PResult<(usize, &'a str)> {
        self.ident().ok_or_else(|| self.err_found(msg))
    }

    /// An instruction or computation name: an identifier with an optional `%`. Returns the start (including the `%`)
    /// and the name without it.
    pub fn name(&mut self) -> Option<(usize, &'a str)> {
        self.ws();
        let start = self.pos;
        if self.raw_peek() == Some(b'%') {
            self.pos += 1;
        }
        match self.ident() {
            Some((_, s)) if self.pos > start => Some((start, s)),
            _ => {
                self.pos = start;
                None
            }
        }
    }

    /// A name, or the error "`msg`, found X".
    pub fn expect_name(&mut self, msg: &str) -> PResult<(usize, &'a str)> {
        self.name().ok_or_else(|| self.err_found(msg))
    }

    /// A decimal integer with an optional sign.
    pub fn int(&mut self, what: &str) -> PResult<i64> {
        self.ws();
        let start = self.pos;
        if matches!(self.raw_peek(), Some(b'-' | b'+')) {
            self.pos += 1;
        }
        let digits = self.pos;
        while self.raw_peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.pos == digits {
            self.pos = start;
            return Err(self.err_found(&format!("expected {what} (an integer)")));
        }
        // Identifier characters glued to the digits (`3x`, `1.5`) are not an integer.
        if self.raw_peek().is_some_and(|c| c.is_ascii_alphabetic() || c == b'.') {
            let end = self.token_end(start);
            fail!(self, start, end, "expected {what} (an integer), found '{}'", self.slice(start, end));
        }
        let text = self.slice(start, self.pos);
        text.parse::<i64>().map_err(|_| {
            self.err_range(
                start,
                self.pos,
                &format!("integer {text} is out of range for a 64-bit value; expected {what}"),
            )
        })
    }

    /// A non-negative integer.
    pub fn uint(&mut self, what: &str) -> PResult<i64> {
        self.ws();
        let start = self.pos;
        let v = self.int(what)?;
        if v < 0 {
            fail!(self, start, self.pos, "expected {what} (a non-negative integer), found {v}");
        }
        Ok(v)
    }

    /// `true` or `false`.
    pub fn boolean(&mut self, what: &str) -> PResult<bool> {
        let save = self.pos;
        match self.ident() {
            Some((_, "true")) => Ok(true),
            Some((_, "false")) => Ok(false),
            _ => {
                self.pos = save;
                Err(self.err_found(&format!("expected true or false for {what}")))
            }
        }
    }

    /// A double-quoted string with C escapes (`\"`, `\\`, `\n`, `\t`, `\xHH`, octal).
    pub fn string(&mut self) -> PResult<String> {
        self.ws();
        let start = self.pos;
        if self.raw_peek() != Some(b'"') {
            return Err(self.err_found("expected a quoted string"));
        }
        self.pos += 1;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(c) = self.raw_peek() else {
                return Err(self.err_range(start, start + 1, "unterminated string; expected a closing '\"'"));
            };
            self.pos += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let Some(e) = self.raw_peek() else { continue };
                    self.pos += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        // `\xHH` (up to two hex digits) or octal `\OOO` (up to three digits).
                        b'x' | b'0'..=b'7' => {
                            let (radix, max, mut v, mut n) =
                                if e == b'x' { (16, 2, 0, 0) } else { (8, 3, u32::from(e - b'0'), 1) };
                            while n < max
                                && let Some(d) = self.raw_peek().and_then(|d| (d as char).to_digit(radix))
                            {
                                v = v * radix + d;
                                self.pos += 1;
                                n += 1;
                            }
                            out.push(v as u8);
                        }
                        other => out.push(other),
                    }
                }
                other => out.push(other),
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Skips a quoted string (`"` or `'`) starting at `pos`, honouring backslash escapes.
    fn skip_quoted(&mut self) -> PResult<()> {
        let start = self.pos;
        let Some(q) = self.raw_peek() else { return Ok(()) };
        self.pos += 1;
        loop {
            match self.raw_peek() {
                None => {
                    fail!(self, start, start + 1, "unterminated string; expected a closing '{}'", q as char);
                }
                Some(b'\\') => self.pos += 2.min(self.b.len() - self.pos),
                Some(c) => {
                    self.pos += 1;
                    if c == q {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// A bracketed value starting at the next significant byte (`{`, `(` or `[`), returned verbatim including its
    /// brackets. Strings inside are skipped whole.
    pub fn balanced(&mut self) -> PResult<&'a str> {
        self.ws();
        let start = self.pos;
        if !matches!(self.raw_peek(), Some(b'{' | b'(' | b'[')) {
            return Err(self.err_found("expected '{', '(' or '['"));
        }
        self.scan_raw(true)?;
        Ok(self.slice(start, self.pos))
    }

    /// A raw attribute value: everything up to a `,` at bracket depth 0, an unmatched closing bracket, or a line break
    /// at depth 0. Returned verbatim.
    pub fn raw_value(&mut self) -> PResult<&'a str> {
        self.ws();
        let start = self.pos;
        self.scan_raw(false)?;
        let text = self.slice(start, self.pos).trim_end();
        if text.is_empty() {
            return Err(self.err_found("expected an attribute value"));
        }
        Ok(text)
    }

    /// Scans balanced text. With `one`, stops right after the first bracket group closes.
    fn scan_raw(&mut self, one: bool) -> PResult<()> {
        let mut stack: Vec<(u8, usize)> = Vec::new();
        loop {
            let Some(c) = self.raw_peek() else {
                return match stack.last() {
                    Some(&(open, at)) => Err(self.err_range(
                        at,
                        at + 1,
                        &format!(
                            "unbalanced '{}': no matching '{}' before the end of the file",
                            open as char,
                            closer(open) as char
                        ),
                    )),
                    None => Ok(()),
                };
            };
            match c {
                b'"' | b'\'' => {
                    // A lone apostrophe at depth 0 is unusual; strings may appear anywhere.
                    self.skip_quoted()?;
                    continue;
                }
                b'{' | b'(' | b'[' => {
                    if stack.len() >= 4 * MAX_DEPTH as usize {
                        return Err(self.err_range(
                            self.pos,
                            self.pos + 1,
                            &format!("value nested too deeply (more than {} levels)", 4 * MAX_DEPTH),
                        ));
                    }
                    stack.push((c, self.pos));
                }
                b'}' | b')' | b']' => match stack.pop() {
                    None => return Ok(()),
                    Some((open, at)) => {
                        if closer(open) != c {
                            return Err(self.err_range(
                                self.pos,
                                self.pos + 1,
                                &format!(
                                    "mismatched '{}': expected '{}' to close the '{}' at {}",
                                    c as char,
                                    closer(open) as char,
                                    open as char,
                                    self.loc(at)
                                ),
                            ));
                        }
                        if one && stack.is_empty() {
                            self.pos += 1;
                            return Ok(());
                        }
                    }
                },
                b',' | b'\n' if stack.is_empty() => return Ok(()),
                _ => {}
            }
            self.pos += 1;
        }
    }

    /// End of the token starting at `start` (an identifier-like run, or one byte).
    pub fn token_end(&self, start: usize) -> usize {
        let mut end = start;
        while self.byte_at(end).is_some_and(|c| is_ident_char(c) || c == b'%' || c == b'+') {
            end += 1;
        }
        if end == start {
            // One whole character (it may be multi-byte).
            end = start + self.src.get(start..).and_then(|s| s.chars().next()).map_or(1, char::len_utf8);
        }
        end.min(self.b.len())
    }

    /// "line:col" of a byte offset, for messages that mention a second place.
    pub fn loc(&self, pos: usize) -> String {
        let s = self.span(pos, pos + 1);
        format!("{}:{}", s.line, s.col)
    }

    /// The span of `src[start..end]` (clipped to its line; at least one character).
    pub fn span(&self, start: usize, end: usize) -> Span {
        let mut start = start.min(self.b.len());
        if start >= self.b.len() || self.slice(start, self.b.len()).trim().is_empty() {
            // End of input: point just past the last significant character.
            start = self.src.trim_end().len();
        }
        let line_idx = self.line_starts.partition_point(|&s| s <= start).saturating_sub(1);
        let line_start = self.line_starts.get(line_idx).copied().unwrap_or(0);
        let line_end = self.src.get(line_start..).and_then(|s| s.find('\n')).map_or(self.b.len(), |i| line_start + i);
        let col = self.src.get(line_start..start).map_or(0, |s| s.chars().count()) + 1;
        let end = end.clamp(start, line_end.max(start));
        let len = self.src.get(start..end).map_or(1, |s| s.chars().count()).max(1);
        Span { line: line_idx as u32 + 1, col: col as u32, len: len as u32 }
    }

    /// An error at `src[start..end]`.
    pub fn err_range(&self, start: usize, end: usize, msg: &str) -> Error {
        if let Some(c) = self.bad_comment {
            return self.make_err(self.span(c, c + 2), "unterminated '/*' comment; expected '*/'");
        }
        self.make_err(self.span(start, end), msg)
    }

    fn make_err(&self, span: Span, msg: &str) -> Error {
        let mut e = Error::at(ErrorKind::Parse, self.file, self.src, span, msg);
        if e.source_line.is_none() {
            e.source_line = Some(String::new());
        }
        e
    }

    /// An error naming what was found at the next significant position: "`msg`, found X".
    pub fn err_found(&mut self, msg: &str) -> Error {
        self.ws();
        let start = self.pos;
        if start >= self.b.len() {
            return self.err_range(start, start, &format!("unexpected end of file; {msg}"));
        }
        let end = self.token_end(start);
        let tok: String = self.slice(start, end).chars().take(40).collect();
        self.err_range(start, end, &format!("{msg}, found '{}'", tok.escape_debug()))
    }

    /// Reports an unterminated comment that swallowed the end of the file.
    pub fn check_comment(&self) -> PResult<()> {
        match self.bad_comment {
            Some(c) => Err(self.err_range(c, c + 2, "")),
            None => Ok(()),
        }
    }
}

fn closer(open: u8) -> u8 {
    match open {
        b'{' => b'}',
        b'(' => b')',
        _ => b']',
    }
}

//! A Matrix Market (`.mtx`) reader for the sparse files SuiteSparse ships.
//!
//! Supported: `%%MatrixMarket matrix coordinate F S` with field F one of
//! `real`, `integer`, `pattern` and symmetry S one of `general`,
//! `symmetric`, `skew-symmetric` (not with `pattern`). Keywords are
//! case-insensitive. Pattern entries get the value 1. A symmetric file
//! stores the lower triangle (row >= column), a skew-symmetric one the
//! strict lower triangle; an entry above the diagonal is an error rather
//! than mirrored twice. Entries at the same position are summed.
//!
//! Every malformed input gives an [`MtxError`] naming the 1-based line and
//! what was wrong; nothing here panics on input.
//!
//! `nalgebra-sparse` has a reader, but it would add about 51 s to a clean
//! build on two cores, cannot read `pattern` or `integer` files as f64, and
//! its errors for a bad index or a short file carry no line number.

use super::csr::{Csr, MAX_DIM};
use super::Error;
use std::io::BufRead;
use std::path::Path;

/// A malformed or unsupported Matrix Market file: where and what.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {kind}")]
pub struct MtxError {
    /// 1-based line number; for a file that ends early, the line after the
    /// last.
    pub line: usize,
    /// What was wrong.
    pub kind: MtxErrorKind,
}

/// What was wrong with a Matrix Market file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MtxErrorKind {
    /// The first line is not a valid `%%MatrixMarket` banner.
    #[error("bad header: {0}")]
    Header(String),
    /// A valid header this reader does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The size line (`rows cols entries`) is missing or malformed.
    #[error("bad size line: {0}")]
    Size(String),
    /// An entry line has the wrong number of fields.
    #[error("expected {expected} fields (`{form}`), found {found}")]
    Fields {
        /// Fields an entry of this file has.
        expected: usize,
        /// Fields on the line.
        found: usize,
        /// The form of an entry.
        form: &'static str,
    },
    /// A field is not a number of the right kind.
    #[error("cannot parse {what} `{text}`")]
    Number {
        /// Which field.
        what: &'static str,
        /// The text found.
        text: String,
    },
    /// A row or column index is 0 or beyond the size line's dimensions.
    #[error("index ({row}, {col}) is outside the {rows}x{cols} matrix (indices start at 1)")]
    IndexOutOfRange {
        /// Row index as written.
        row: u64,
        /// Column index as written.
        col: u64,
        /// Rows from the size line.
        rows: usize,
        /// Columns from the size line.
        cols: usize,
    },
    /// A (skew-)symmetric file has an entry its storage excludes.
    #[error("{symmetry} file has an entry at ({row}, {col}); it stores only {allowed}")]
    Triangle {
        /// `symmetric` or `skew-symmetric`.
        symmetry: &'static str,
        /// Row index as written.
        row: u64,
        /// Column index as written.
        col: u64,
        /// The part of the matrix such files store.
        allowed: &'static str,
    },
    /// The file ends before the entries the size line announced.
    #[error("missing entries: the size line announces {expected}, the file has {found}")]
    MissingEntries {
        /// Entries announced.
        expected: usize,
        /// Entries present.
        found: usize,
    },
    /// Data after the announced entries.
    #[error("more entries than the {expected} the size line announces")]
    ExtraEntries {
        /// Entries announced.
        expected: usize,
    },
    /// The line is not UTF-8 or could not be read.
    #[error("unreadable line: {0}")]
    Read(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Real,
    Integer,
    Pattern,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Symmetry {
    General,
    Symmetric,
    Skew,
}

/// Reads the file at `path`.
pub fn read_mtx(path: impl AsRef<Path>) -> Result<Csr, Error> {
    let path = path.as_ref();
    let io = |e: std::io::Error| Error::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let file = std::fs::File::open(path).map_err(io)?;
    Ok(read_mtx_from(std::io::BufReader::new(file))?)
}

/// Reads a whole file held in a string.
pub fn read_mtx_str(text: &str) -> Result<Csr, MtxError> {
    read_mtx_from(text.as_bytes())
}

/// Reads from any buffered reader, one line at a time.
///
/// # Time Complexity
/// O(entries + rows), plus the row sorts of [`Csr::from_triplets`].
pub fn read_mtx_from(mut reader: impl BufRead) -> Result<Csr, MtxError> {
    let mut lines = Lines {
        reader: &mut reader,
        buf: Vec::new(),
        number: 0,
    };
    let err = |line, kind| MtxError { line, kind };

    // Banner.
    let Some(banner) = lines.next()? else {
        return Err(err(1, MtxErrorKind::Header("the file is empty".into())));
    };
    let (field, symmetry) = parse_banner(&banner).map_err(|k| err(1, k))?;

    // Comments, then the size line.
    let (rows, cols, entries) = loop {
        let Some(line) = lines.next()? else {
            return Err(err(
                lines.number + 1,
                MtxErrorKind::Size("the file ends before the size line".into()),
            ));
        };
        if is_skipped(&line) {
            continue;
        }
        break parse_size(&line, symmetry).map_err(|k| err(lines.number, k))?;
    };

    let (expected, form) = match field {
        Field::Pattern => (2, "row col"),
        Field::Real | Field::Integer => (3, "row col value"),
    };
    // A hostile size line must not make us reserve terabytes.
    let mirrored = if symmetry == Symmetry::General { 1 } else { 2 };
    let mut triplets = Vec::with_capacity(entries.min(1 << 24) * mirrored);
    let mut found = 0usize;
    while let Some(line) = lines.next()? {
        if is_skipped(&line) {
            continue;
        }
        let at = lines.number;
        if found == entries {
            return Err(err(at, MtxErrorKind::ExtraEntries { expected: entries }));
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != expected {
            return Err(err(
                at,
                MtxErrorKind::Fields {
                    expected,
                    found: fields.len(),
                    form,
                },
            ));
        }
        let row = parse_index(fields[0], "row index").map_err(|k| err(at, k))?;
        let col = parse_index(fields[1], "column index").map_err(|k| err(at, k))?;
        if row == 0 || col == 0 || row > rows as u64 || col > cols as u64 {
            return Err(err(
                at,
                MtxErrorKind::IndexOutOfRange {
                    row,
                    col,
                    rows,
                    cols,
                },
            ));
        }
        let value = match field {
            Field::Pattern => 1.0,
            Field::Real => parse_real(fields[2]).map_err(|k| err(at, k))?,
            Field::Integer => parse_integer(fields[2]).map_err(|k| err(at, k))?,
        };
        let triangle = |symmetry, allowed| {
            err(
                at,
                MtxErrorKind::Triangle {
                    symmetry,
                    row,
                    col,
                    allowed,
                },
            )
        };
        let (r, c) = (row as u32 - 1, col as u32 - 1);
        triplets.push((r, c, value));
        match symmetry {
            Symmetry::General => {}
            Symmetry::Symmetric => {
                if row < col {
                    return Err(triangle("symmetric", "the lower triangle (row >= column)"));
                }
                if r != c {
                    triplets.push((c, r, value));
                }
            }
            Symmetry::Skew => {
                if row <= col {
                    return Err(triangle(
                        "skew-symmetric",
                        "the strict lower triangle (row > column)",
                    ));
                }
                triplets.push((c, r, -value));
            }
        }
        found += 1;
    }
    if found < entries {
        return Err(err(
            lines.number + 1,
            MtxErrorKind::MissingEntries {
                expected: entries,
                found,
            },
        ));
    }
    // Indices were checked against the dimensions, which are at most
    // MAX_DIM, so this cannot fail.
    Csr::from_triplets(rows, cols, &triplets).map_err(|e| {
        err(
            lines.number,
            MtxErrorKind::Size(format!("cannot build the matrix: {e}")),
        )
    })
}

/// Lines with their 1-based numbers, as UTF-8, without the line ending.
struct Lines<'a, R> {
    reader: &'a mut R,
    buf: Vec<u8>,
    number: usize,
}

impl<R: BufRead> Lines<'_, R> {
    fn next(&mut self) -> Result<Option<String>, MtxError> {
        self.buf.clear();
        let read = self.reader.read_until(b'\n', &mut self.buf);
        let at = self.number + 1;
        match read {
            Ok(0) => return Ok(None),
            Ok(_) => self.number = at,
            Err(e) => {
                return Err(MtxError {
                    line: at,
                    kind: MtxErrorKind::Read(e.to_string()),
                })
            }
        }
        match std::str::from_utf8(&self.buf) {
            Ok(s) => Ok(Some(s.trim_end_matches(['\n', '\r']).to_owned())),
            Err(e) => Err(MtxError {
                line: at,
                kind: MtxErrorKind::Read(format!("not UTF-8 ({e})")),
            }),
        }
    }
}

/// Blank lines and `%` comments, allowed anywhere after the banner.
fn is_skipped(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with('%')
}

fn parse_banner(line: &str) -> Result<(Field, Symmetry), MtxErrorKind> {
    let header = |m: &str| MtxErrorKind::Header(m.to_owned());
    let words: Vec<String> = line.split_whitespace().map(str::to_lowercase).collect();
    if words.first().map(String::as_str) != Some("%%matrixmarket") {
        return Err(header("the first line must start with `%%MatrixMarket`"));
    }
    if words.len() != 5 {
        return Err(header(
            "expected `%%MatrixMarket matrix coordinate <field> <symmetry>`",
        ));
    }
    if words[1] != "matrix" {
        return Err(header(&format!("object `{}` is not `matrix`", words[1])));
    }
    let unsupported = |m: String| Err(MtxErrorKind::Unsupported(m));
    match words[2].as_str() {
        "coordinate" => {}
        "array" => return unsupported("dense `array` files; use `coordinate`".into()),
        w => {
            return Err(header(&format!(
                "format `{w}` is neither `coordinate` nor `array`"
            )))
        }
    }
    let field = match words[3].as_str() {
        "real" => Field::Real,
        "integer" => Field::Integer,
        "pattern" => Field::Pattern,
        "complex" => return unsupported("`complex` values".into()),
        w => return Err(header(&format!("unknown field `{w}`"))),
    };
    let symmetry = match words[4].as_str() {
        "general" => Symmetry::General,
        "symmetric" => Symmetry::Symmetric,
        "skew-symmetric" => Symmetry::Skew,
        "hermitian" => return unsupported("`hermitian` matrices".into()),
        w => return Err(header(&format!("unknown symmetry `{w}`"))),
    };
    if field == Field::Pattern && symmetry == Symmetry::Skew {
        return Err(header("a `pattern` matrix cannot be `skew-symmetric`"));
    }
    Ok((field, symmetry))
}

fn parse_size(line: &str, symmetry: Symmetry) -> Result<(usize, usize, usize), MtxErrorKind> {
    let size = |m: String| MtxErrorKind::Size(m);
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [r, c, e] = fields[..] else {
        return Err(size(format!(
            "expected `rows cols entries`, found {} fields",
            fields.len()
        )));
    };
    let number = |t: &str, what| {
        t.parse::<usize>()
            .map_err(|_| size(format!("{what} `{t}` is not a non-negative integer")))
    };
    let (rows, cols, entries) = (
        number(r, "rows")?,
        number(c, "columns")?,
        number(e, "entries")?,
    );
    if rows > MAX_DIM || cols > MAX_DIM {
        return Err(size(format!(
            "{rows}x{cols} is too large: at most {MAX_DIM} rows and columns"
        )));
    }
    if symmetry != Symmetry::General && rows != cols {
        return Err(size(format!(
            "a symmetric matrix must be square, not {rows}x{cols}"
        )));
    }
    if entries as u128 > rows as u128 * cols as u128 {
        return Err(size(format!(
            "{entries} entries do not fit in a {rows}x{cols} matrix"
        )));
    }
    Ok((rows, cols, entries))
}

fn parse_index(text: &str, what: &'static str) -> Result<u64, MtxErrorKind> {
    text.parse::<u64>().map_err(|_| MtxErrorKind::Number {
        what,
        text: text.to_owned(),
    })
}

fn parse_real(text: &str) -> Result<f64, MtxErrorKind> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(MtxErrorKind::Number {
            what: "real value",
            text: text.to_owned(),
        }),
    }
}

fn parse_integer(text: &str) -> Result<f64, MtxErrorKind> {
    // Integers beyond 2^53 round to the nearest f64, as any reader into f64
    // must.
    text.parse::<i64>()
        .map(|v| v as f64)
        .map_err(|_| MtxErrorKind::Number {
            what: "integer value",
            text: text.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(text: &str) -> Vec<Vec<f64>> {
        read_mtx_str(text).unwrap().to_dense()
    }

    #[test]
    fn general_real() {
        let m = read_mtx_str(
            "%%MatrixMarket matrix coordinate real general\n\
             % a comment\n\
             \n\
             3 4 4\n\
             1 1 1.5\n\
             3 4 -2e-3\n\
             2 2 7\n\
             3 1 .25\n",
        )
        .unwrap();
        assert_eq!((m.rows(), m.cols(), m.nnz()), (3, 4, 4));
        assert_eq!(
            m.to_dense(),
            [
                vec![1.5, 0., 0., 0.],
                vec![0., 7., 0., 0.],
                vec![0.25, 0., 0., -0.002]
            ]
        );
    }

    #[test]
    fn symmetric_integer_mirrors_the_lower_triangle() {
        let d = dense(
            "%%MatrixMarket matrix coordinate integer symmetric\n\
             3 3 3\n\
             1 1 2\n\
             3 1 -5\n\
             3 2 4\n",
        );
        assert_eq!(d, [vec![2., 0., -5.], vec![0., 0., 4.], vec![-5., 4., 0.]]);
    }

    #[test]
    fn pattern_general_and_symmetric() {
        let d = dense("%%MatrixMarket matrix coordinate pattern general\n2 3 2\n1 3\n2 1\n");
        assert_eq!(d, [vec![0., 0., 1.], vec![1., 0., 0.]]);
        let d = dense("%%MatrixMarket matrix coordinate pattern symmetric\n2 2 2\n1 1\n2 1\n");
        assert_eq!(d, [vec![1., 1.], vec![1., 0.]]);
    }

    #[test]
    fn skew_symmetric_negates_the_mirror() {
        let d = dense("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n2 1 3\n");
        assert_eq!(d, [vec![0., -3.], vec![3., 0.]]);
    }

    #[test]
    fn lenient_where_files_differ() {
        // Mixed-case keywords, CRLF, extra spaces, no final newline,
        // duplicates summed, comments between entries.
        let m = read_mtx_str(
            "%%matrixmarket MATRIX Coordinate Real General\r\n\
             2  2  3 \r\n\
             1 1 1\r\n\
             % interleaved\r\n\
             \t1 1   2\r\n\
             2 2 1E+1",
        )
        .unwrap();
        assert_eq!(m.to_dense(), [vec![3., 0.], vec![0., 10.]]);
        assert_eq!(m.nnz(), 2);
    }

    #[test]
    fn empty_matrices() {
        let m = read_mtx_str("%%MatrixMarket matrix coordinate real general\n0 0 0\n").unwrap();
        assert_eq!((m.rows(), m.cols(), m.nnz()), (0, 0, 0));
        let m = read_mtx_str("%%MatrixMarket matrix coordinate pattern general\n5 3 0\n").unwrap();
        assert_eq!((m.rows(), m.cols(), m.nnz()), (5, 3, 0));
    }

    /// (file, line the error names, a word its message must contain)
    const MALFORMED: &[(&str, usize, &str)] = &[
        ("", 1, "empty"),
        ("3 3 1\n1 1 1\n", 1, "%%MatrixMarket"),
        (
            "%%MatrixMarket matrix coordinate real\n1 1 0\n",
            1,
            "expected",
        ),
        (
            "%%MatrixMarket vector coordinate real general\n",
            1,
            "object",
        ),
        (
            "%%MatrixMarket matrix array real general\n1 1\n1\n",
            1,
            "array",
        ),
        (
            "%%MatrixMarket matrix coordinate complex general\n",
            1,
            "complex",
        ),
        (
            "%%MatrixMarket matrix coordinate real hermitian\n",
            1,
            "hermitian",
        ),
        (
            "%%MatrixMarket matrix coordinate double general\n",
            1,
            "field",
        ),
        (
            "%%MatrixMarket matrix coordinate real upper\n",
            1,
            "symmetry",
        ),
        (
            "%%MatrixMarket matrix coordinate pattern skew-symmetric\n",
            1,
            "pattern",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n% only a comment\n",
            3,
            "size line",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n%\n3 3\n",
            3,
            "found 2 fields",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n3 x 1\n",
            2,
            "columns `x`",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n-3 3 1\n",
            2,
            "rows `-3`",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 5\n",
            2,
            "do not fit",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n4294967296 1 0\n",
            2,
            "too large",
        ),
        (
            "%%MatrixMarket matrix coordinate real symmetric\n2 3 1\n",
            2,
            "square",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n",
            4,
            "missing entries",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1\n2 2 2\n",
            4,
            "more entries",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1\n",
            3,
            "expected 3 fields",
        ),
        (
            "%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 1 1\n",
            3,
            "expected 2 fields",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n\n1 1 1.5.2\n",
            4,
            "real value `1.5.2`",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 nan\n",
            3,
            "real value",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 inf\n",
            3,
            "real value",
        ),
        (
            "%%MatrixMarket matrix coordinate integer general\n2 2 1\n1 1 1.5\n",
            3,
            "integer value",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 x 1\n",
            3,
            "column index `x`",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n-1 1 1\n",
            3,
            "row index `-1`",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n0 1 1\n",
            3,
            "outside",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 3 1\n",
            3,
            "outside",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n3 1 1\n",
            3,
            "outside",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n99999999999999999999 1 1\n",
            3,
            "row index",
        ),
        (
            "%%MatrixMarket matrix coordinate real symmetric\n2 2 1\n1 2 1\n",
            3,
            "lower triangle",
        ),
        (
            "%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n1 1 1\n",
            3,
            "strict lower",
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n1 1 1\n1 1 \u{fffd}\n",
            3,
            "real value",
        ),
    ];

    #[test]
    fn every_malformed_file_names_its_line() {
        for &(text, line, word) in MALFORMED {
            let e = read_mtx_str(text).expect_err(text);
            let message = e.to_string();
            assert_eq!(e.line, line, "{text:?} gave {message}");
            assert!(message.starts_with(&format!("line {line}: ")), "{message}");
            assert!(
                message.contains(word),
                "{text:?} gave {message}, not {word:?}"
            );
        }
    }

    #[test]
    fn invalid_utf8_names_its_line() {
        let bytes = b"%%MatrixMarket matrix coordinate real general\n1 1 1\n1 1 \xff\n";
        let e = read_mtx_from(&bytes[..]).unwrap_err();
        assert_eq!(e.line, 3);
        assert!(matches!(e.kind, MtxErrorKind::Read(_)));
    }

    #[test]
    fn files_on_disk() {
        let dir = std::env::temp_dir().join(format!("cuheap-mtx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.mtx");
        std::fs::write(
            &path,
            "%%MatrixMarket matrix coordinate real general\n1 1 1\n1 1 2\n",
        )
        .unwrap();
        assert_eq!(read_mtx(&path).unwrap().values(), [2.0]);
        std::fs::write(
            &path,
            "%%MatrixMarket matrix coordinate real general\n1 1 1\n",
        )
        .unwrap();
        let e = read_mtx(&path).unwrap_err();
        assert!(matches!(e, Error::Mtx(MtxError { line: 3, .. })), "{e}");
        assert!(matches!(
            read_mtx(dir.join("missing.mtx")),
            Err(Error::Io { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

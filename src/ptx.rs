//! Reading and editing the PTX text the crate loads: its kernels
//! (`.entry`) and their parameters, and register caps written into it.

use crate::{Error, Result};

/// `ptx` with a `.maxnreg` directive before the body of every entry that
/// `cap` gives a number of registers (`None`: the entry is left as it
/// is, under the module's cap if one is set). An entry whose
/// header already has a `.maxnreg` keeps it. An error if an entry's body
/// cannot be found (the PTX is not what the kernels' build writes).
pub(crate) fn with_register_caps(ptx: &str, cap: impl Fn(&str) -> Option<u32>) -> Result<String> {
    let mut out = String::with_capacity(ptx.len() + 4096);
    let mut rest = ptx;
    while let Some((at, name)) = entry_at(rest) {
        let Some(cap) = cap(name) else {
            // Left as it is: the search goes on past its declaration.
            let next = rest[at..].find('\n').map_or(rest.len(), |n| at + n + 1);
            out.push_str(&rest[..next]);
            rest = &rest[next..];
            continue;
        };
        // The header (name, parameters, directives) ends where the body
        // opens; parameters hold no braces.
        let body = rest[at..].find('{').map(|b| at + b).ok_or_else(|| {
            Error::InvalidArgument(format!("register caps: no body for entry {name}"))
        })?;
        let header = &rest[at..body];
        out.push_str(&rest[..body]);
        if !header.contains(".maxnreg") {
            if !header.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!(".maxnreg {cap}\n"));
        }
        // The body's brace, so that the search goes on after it.
        out.push('{');
        rest = &rest[body + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The next entry's declaration in `ptx` ([`entry_name`]): where
/// its line's text begins, and its name.
fn entry_at(ptx: &str) -> Option<(usize, &str)> {
    let mut line_start = 0;
    for line in ptx.split_inclusive('\n') {
        if let Some(name) = entry_name(line) {
            return Some((line_start + line.len() - line.trim_start().len(), name));
        }
        line_start += line.len();
    }
    None
}

/// The name of the kernel a PTX line declares (`.entry NAME(`, bare or
/// after `.visible` or `.weak`), if it declares one.
fn entry_name(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace();
    let mut word = words.next()?;
    if word == ".visible" || word == ".weak" {
        word = words.next()?;
    }
    if word != ".entry" {
        return None;
    }
    let name = words.next()?.split('(').next()?;
    (!name.is_empty()).then_some(name)
}

/// The kernels (`.entry`) of `ptx` with the size in bytes of each
/// parameter, as the PTX declares them.
pub fn entries(ptx: &str) -> impl Iterator<Item = (&str, Vec<usize>)> {
    let mut lines = ptx.lines();
    std::iter::from_fn(move || {
        let name = lines.by_ref().find_map(entry_name)?;
        let params = lines
            .by_ref()
            .map(str::trim)
            .take_while(|l| !l.starts_with(')'))
            .map(param_size)
            .collect();
        Some((name, params))
    })
}

/// The size of one `.param` line of an entry: `.param .u32 x`,
/// `.param .u64 .ptr .align 1 x`, `.param .align 8 .b8 x[24]`.
fn param_size(line: &str) -> usize {
    let line = line.trim_end_matches(',');
    if let Some((_, count)) = line.split_once('[') {
        let elem = if line.contains(".b8 ") { 1 } else { 0 };
        return elem * count.trim_end_matches(']').parse::<usize>().unwrap_or(0);
    }
    line.split_whitespace()
        .find_map(|w| match w {
            ".u8" | ".s8" | ".b8" => Some(1),
            ".u16" | ".s16" | ".b16" | ".f16" => Some(2),
            ".u32" | ".s32" | ".b32" | ".f32" => Some(4),
            ".u64" | ".s64" | ".b64" | ".f64" => Some(8),
            _ => None,
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_sizes_from_ptx_lines() {
        assert_eq!(param_size(".param .u32 k_param_1,"), 4);
        assert_eq!(param_size(".param .u64 .ptr .align 1 k_param_3"), 8);
        assert_eq!(param_size(".param .align 8 .b8 k_param_0[24],"), 24);
    }
}

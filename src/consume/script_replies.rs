//! Test support: the reply tags of a tagged script (`{ id, 'tag', … }`, see
//! [`crate::redis::tagged`]) against the tags its Rust wrapper parses.
//!
//! Tags are read from the script's code lines only: a `--` comment (a whole
//! line, or the tail of one) may name replies the script no longer makes,
//! or never made, and must not make such a test pass.

use std::collections::BTreeSet;

use redis::{RedisResult, Value};

/// `line` without its Lua comment (`--` outside a string).
fn code_of(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut chars = line.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match (quote, c) {
            (Some(_), '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '-') if chars.peek().is_some_and(|(_, next)| *next == '-') => return &line[..at],
            (None, _) => {}
        }
    }
    line
}

/// The tags `lua` replies: the quoted word in each `{ <name>, '<tag>'` of
/// its code.
pub(super) fn replied_tags(lua: &str) -> BTreeSet<String> {
    let mut tags = BTreeSet::new();
    for code in lua.lines().map(code_of) {
        for (at, _) in code.match_indices('{') {
            let rest = code[at + 1..].trim_start();
            let name_end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
            if name_end == 0 {
                continue;
            }
            let Some(rest) = rest[name_end..].trim_start().strip_prefix(',') else { continue };
            let rest = rest.trim_start();
            let Some(quote) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') else { continue };
            if let Some(end) = rest[1..].find(quote) {
                tags.insert(rest[1..1 + end].to_owned());
            }
        }
    }
    tags
}

/// Whether `parse` refused `tag` as unknown ([`crate::redis::unknown_tag`]),
/// not merely for the rest of a made-up reply.
fn refused<T>(parse: &impl Fn(&Value) -> RedisResult<T>, tag: &str) -> bool {
    let item = Value::Array(vec![Value::BulkString(b"1-0".to_vec()), Value::BulkString(tag.as_bytes().to_vec())]);
    parse(&item).is_err_and(|e| e.detail().is_some_and(|detail| detail.ends_with(&format!("replied `{tag}`"))))
}

/// A bulk string reply of `text`, as a script's reply item holds it.
pub(super) fn bulk(text: &str) -> Value {
    Value::BulkString(text.as_bytes().to_vec())
}

/// Asserts that `script` (its text `lua`) replies exactly the tags `known`,
/// the wrapper's outcomes, and that `parse` takes each of them and refuses
/// another: both ways, so a script made to reply an unknown tag fails, and
/// so does a wrapper that expects a reply the script no longer makes.
pub(super) fn assert_replies_agree<T>(
    script: &str,
    lua: &str,
    known: &[&str],
    parse: impl Fn(&Value) -> RedisResult<T>,
) {
    let replied = replied_tags(lua);
    let known: BTreeSet<String> = known.iter().map(|tag| (*tag).to_owned()).collect();
    let unknown: Vec<&String> = replied.difference(&known).collect();
    assert!(unknown.is_empty(), "{script} replies {unknown:?}, which its wrapper does not know");
    let unreplied: Vec<&String> = known.difference(&replied).collect();
    assert!(unreplied.is_empty(), "{script} never replies {unreplied:?}, which its wrapper expects");
    for tag in &known {
        assert!(!refused(&parse, tag), "the wrapper of {script} refuses its reply `{tag}`");
    }
    assert!(refused(&parse, "no_such_tag"), "the wrapper of {script} takes a tag it does not know");
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "-- Replies { id, 'in_comment' }\n\
                          out[#out + 1] = { id, 'claimed', n } -- or { id, 'trailing' }\n\
                          out[#out + 1] = { id, \"deleted\" }\n\
                          local s = '--not a comment' .. { id, 'after_string' }\n";

    #[test]
    fn tags_come_from_code_lines_only() {
        let tags: Vec<String> = replied_tags(SCRIPT).into_iter().collect();
        assert_eq!(tags, ["after_string", "claimed", "deleted"]);
    }

    #[test]
    #[should_panic(expected = "which its wrapper does not know")]
    fn a_script_that_replies_an_unknown_tag_fails() {
        let parse = |item: &Value| -> RedisResult<()> {
            let (_, tag, _) = crate::redis::tagged(item)?;
            match tag.as_str() {
                "claimed" | "deleted" => Ok(()),
                other => Err(crate::redis::unknown_tag("x.lua", other)),
            }
        };
        assert_replies_agree("x.lua", SCRIPT, &["claimed", "deleted"], parse);
    }
}

//! Reading a spec document from outside, bounded: its size, its encoding, how many values and how
//! many bytes of strings it expands to (a YAML alias repeats a whole subtree, so 140 KB can stand
//! for 10⁸ values, and 600 KB for 80 GiB of copies of one long string), how deep
//! it nests, and no key twice in one mapping (last-wins would let a reviewer and the launcher read
//! the same text differently). Yields the generic JSON value that the typed model is read from;
//! knows nothing of KubeVirt.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A VMI with 256 disks and volumes is about 40 KiB; KubeVirt's API server takes 3 MiB requests.
pub(crate) const MAX_DOCUMENT_BYTES: usize = 1 << 20;
/// Values after alias expansion; a large valid VMI has a few thousand.
pub(crate) const MAX_VALUES: usize = 200_000;
/// Bytes of strings and keys after alias expansion. Without aliases a document expands to at
/// most its own size (escapes only shrink), so this only ever refuses what aliases multiplied.
pub(crate) const MAX_EXPANDED_BYTES: usize = 4 * MAX_DOCUMENT_BYTES;

/// Why a document could not be read; `path` is the field it is about (`(document)` for the whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DocumentProblem {
    pub path: String,
    pub message: String,
}

impl DocumentProblem {
    fn whole(message: String) -> Self {
        DocumentProblem {
            path: "(document)".into(),
            message,
        }
    }
}

impl From<DocumentProblem> for super::SpecErrors {
    fn from(p: DocumentProblem) -> Self {
        super::SpecErrors::one(p.path, super::Problem::Syntax { message: p.message })
    }
}

/// The document's text: at most [`MAX_DOCUMENT_BYTES`], UTF-8.
pub(crate) fn text_of(bytes: &[u8]) -> Result<&str, DocumentProblem> {
    check_size(bytes.len())?;
    std::str::from_utf8(bytes).map_err(|e| {
        DocumentProblem::whole(format!(
            "not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })
}

/// A document of `len` bytes is within [`MAX_DOCUMENT_BYTES`]: checked before reading a file.
pub(crate) fn check_size(len: usize) -> Result<(), DocumentProblem> {
    if len > MAX_DOCUMENT_BYTES {
        return Err(DocumentProblem::whole(format!(
            "{len} bytes, at most {MAX_DOCUMENT_BYTES}"
        )));
    }
    Ok(())
}

/// Parses JSON (text starting with `{`) or YAML into a value, within the bounds above. Nesting is
/// bounded by the parsers' own recursion limits (128 levels).
pub(crate) fn read(text: &str) -> Result<Value, DocumentProblem> {
    check_size(text.len())?;
    let is_json = text.trim_start().starts_with('{');
    let mut budget = Budget {
        left: MAX_VALUES,
        bytes_left: MAX_EXPANDED_BYTES,
        problem: None,
        aliases: if is_json { "" } else { " (YAML aliases)" },
    };
    let root = Node {
        budget: &mut budget,
        path: Path::Root,
    };
    let parsed = if is_json {
        let mut de = serde_json::Deserializer::from_str(text);
        root.deserialize(&mut de)
            .and_then(|v| de.end().map(|()| v))
            .map_err(|e| e.to_string())
    } else {
        root.deserialize(serde_yaml_ng::Deserializer::from_str(text))
            .map_err(|e| e.to_string())
    };
    // A problem found by the budget carries its own path; the parser's message only repeats it.
    parsed.map_err(|parser| {
        budget
            .problem
            .take()
            .unwrap_or_else(|| DocumentProblem::whole(parser))
    })
}

struct Budget {
    left: usize,
    bytes_left: usize,
    problem: Option<DocumentProblem>,
    aliases: &'static str,
}

/// Where a value sits, built only when a problem needs it printed.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, key) => write!(f, "{key}"),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

impl Path<'_> {
    fn name(&self) -> String {
        match self {
            Path::Root => "(document)".into(),
            _ => self.to_string(),
        }
    }
}

/// Builds one value, spending the budget for it and everything under it.
struct Node<'b, 'p> {
    budget: &'b mut Budget,
    path: Path<'p>,
}

impl Node<'_, '_> {
    fn fail<E: de::Error>(&mut self, message: String) -> E {
        let problem = DocumentProblem {
            path: self.path.name(),
            message,
        };
        let text = problem.message.clone();
        self.budget.problem.get_or_insert(problem);
        E::custom(text)
    }

    fn string<E: de::Error>(mut self, v: String) -> Result<Value, E> {
        self.spend()?;
        // XML 1.0 cannot carry these, and every string may end up in the domain XML.
        if let Some(ch) = v
            .chars()
            .find(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
        {
            return Err(self.fail(format!("control character U+{:04X}", u32::from(ch))));
        }
        Ok(Value::String(v))
    }

    fn spend<E: de::Error>(&mut self) -> Result<(), E> {
        if self.budget.left == 0 {
            let message = format!(
                "the document expands to more than {MAX_VALUES} values{}",
                self.budget.aliases
            );
            return Err(self.fail(message));
        }
        self.budget.left -= 1;
        Ok(())
    }

    /// Charged for a string or key before it is copied or scanned: an alias replays the same
    /// borrowed text, and it is the copies that would take the memory.
    fn spend_bytes<E: de::Error>(&mut self, len: usize) -> Result<(), E> {
        if len > self.budget.bytes_left {
            let message = format!(
                "the document expands to more than {MAX_EXPANDED_BYTES} bytes of strings{}",
                self.budget.aliases
            );
            return Err(self.fail(message));
        }
        self.budget.bytes_left -= len;
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML or JSON value")
    }

    fn visit_bool<E: de::Error>(mut self, v: bool) -> Result<Value, E> {
        self.spend()?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(mut self, v: i64) -> Result<Value, E> {
        self.spend()?;
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(mut self, v: u64) -> Result<Value, E> {
        self.spend()?;
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(mut self, v: f64) -> Result<Value, E> {
        self.spend()?;
        // NaN and infinities have no JSON form; a spec never needs them.
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| self.fail(format!("{v} is not a finite number")))
    }

    fn visit_str<E: de::Error>(mut self, v: &str) -> Result<Value, E> {
        self.spend_bytes(v.len())?;
        self.string(v.to_owned())
    }

    fn visit_string<E: de::Error>(mut self, v: String) -> Result<Value, E> {
        self.spend_bytes(v.len())?;
        self.string(v)
    }

    fn visit_unit<E: de::Error>(mut self) -> Result<Value, E> {
        self.spend()?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Value, A::Error> {
        self.spend()?;
        let mut items = Vec::new();
        loop {
            let path = Path::Index(&self.path, items.len());
            let child = Node {
                budget: &mut *self.budget,
                path,
            };
            match seq.next_element_seed(child)? {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Value, A::Error> {
        self.spend()?;
        let mut object = Map::new();
        while let Some(key) = map.next_key_seed(Key(&mut self))? {
            if object.contains_key(&key) {
                return Err(self.fail(format!("duplicate key {key:?}")));
            }
            let child = Node {
                budget: &mut *self.budget,
                path: Path::Key(&self.path, &key),
            };
            let value = map.next_value_seed(child)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Reads a mapping's key as a string, as `String` would, charging its bytes to the budget first:
/// an aliased mapping replays its keys too.
struct Key<'n, 'b, 'p>(&'n mut Node<'b, 'p>);

impl<'de> DeserializeSeed<'de> for Key<'_, '_, '_> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_string(self)
    }
}

impl<'de> Visitor<'de> for Key<'_, '_, '_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        self.0.spend_bytes(v.len())?;
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        self.0.spend_bytes(v.len())?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(text: &str) -> String {
        let p = read(text).unwrap_err();
        format!("{}: {}", p.path, p.message)
    }

    #[test]
    fn yaml_and_json_read_to_the_same_value() {
        let yaml = read("a: [1, -2, 2.5, x, true, ~]\nb: {c: d}\n").unwrap();
        let json = read(r#"{"a": [1, -2, 2.5, "x", true, null], "b": {"c": "d"}}"#).unwrap();
        assert_eq!(yaml, json);
        assert_eq!(yaml["b"]["c"], "d");
    }

    #[test]
    fn aliases_within_the_budget_are_expanded() {
        let v = read("a: &x [1, 2]\nb: *x\n").unwrap();
        assert_eq!(v["b"], serde_json::json!([1, 2]));
    }

    #[test]
    fn an_alias_bomb_stops_at_the_budget_with_the_path_it_reached() {
        // 300 aliases of a 1,001-value list: 300,301 values, over the 200,000 budget. Before `y`'s
        // items, 1,004 values are spent (root, status, x and its 1,000, y); 198 aliases spend
        // 198,198 more, leaving 798: the 199th list itself, then its items 0 to 796.
        let list = vec!["~"; 1000].join(", ");
        let aliases = vec!["*x"; 300].join(", ");
        let text = format!("status:\n  x: &x [{list}]\n  y: [{aliases}]\n");
        assert_eq!(
            problem(&text),
            "status.y[198][797]: the document expands to more than 200000 values (YAML aliases)"
        );
    }

    #[test]
    fn a_bomb_of_long_strings_stops_at_the_byte_budget() {
        // 100 aliases of a 64 KiB string: 6.4 MiB of copies from a 66 KB document, far under
        // the value budget. 4 MiB is 64 copies exactly; with the keys' 8 bytes (status, s, l)
        // the 64th copy, alias 62 after the anchored original, is the first one over.
        let long = "A".repeat(1 << 16);
        let aliases = vec!["*a"; 100].join(", ");
        let text = format!("status:\n  s: &a {long}\n  l: [{aliases}]\n");
        assert_eq!(
            problem(&text),
            "status.l[62]: the document expands to more than 4194304 bytes of strings (YAML aliases)"
        );
    }

    #[test]
    fn a_bomb_of_long_keys_stops_at_the_byte_budget() {
        // The same with a mapping whose key is the long string; its value 1 is no string.
        let long = "k".repeat(1 << 16);
        let aliases = vec!["*a"; 100].join(", ");
        // A key this long must be explicit (`?`): YAML caps implicit keys at 1,024 characters.
        let text = format!("status:\n  s: &a\n    ? {long}\n    : 1\n  l: [{aliases}]\n");
        assert_eq!(
            problem(&text),
            "status.l[62]: the document expands to more than 4194304 bytes of strings (YAML aliases)"
        );
    }

    #[test]
    fn a_document_without_aliases_never_reaches_the_byte_budget() {
        // One string as long as a document may be, read once.
        let text = format!("s: {}\n", "A".repeat(MAX_DOCUMENT_BYTES - 4));
        assert_eq!(
            read(&text).unwrap()["s"].as_str().unwrap().len(),
            MAX_DOCUMENT_BYTES - 4
        );
    }

    #[test]
    fn duplicate_keys_are_named_with_their_mapping() {
        assert_eq!(
            problem("metadata:\n  name: a\n  labels: {x: 1, x: 2}\n"),
            "metadata.labels: duplicate key \"x\""
        );
        assert_eq!(
            problem(r#"{"kind": "a", "kind": "b"}"#),
            "(document): duplicate key \"kind\""
        );
    }

    #[test]
    fn size_and_encoding_are_checked_before_parsing() {
        let big = vec![b' '; MAX_DOCUMENT_BYTES + 1];
        assert_eq!(
            text_of(&big).unwrap_err().message,
            "1048577 bytes, at most 1048576"
        );
        assert_eq!(
            text_of(b"name: b\xffad").unwrap_err().message,
            "not UTF-8 (invalid byte at offset 7)"
        );
        assert_eq!(text_of(b"name: bad").unwrap(), "name: bad");
    }

    #[test]
    fn syntax_errors_come_from_the_parser() {
        assert!(problem("kind: [\n").starts_with("(document): did not find expected node content"));
        assert!(problem("{\"a\": 1,}").starts_with("(document): trailing comma"));
    }

    #[test]
    fn deep_nesting_hits_the_parsers_recursion_limit() {
        let deep = format!("x: {}{}\n", "[".repeat(200), "]".repeat(200));
        assert!(
            problem(&deep).contains("recursion limit exceeded"),
            "{}",
            problem(&deep)
        );
    }
}

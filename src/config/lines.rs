//! Where a config key is written in the TOML file, so that `check-config` can point at the
//! line of each problem.

use toml_edit::{Document, Item, Key, TableLike};

/// The 1-based line of `key` in `text`, as errors name keys: `sinks.api.url`,
/// `routes[1].sink`, `kafka.connection."sasl.password"`. A key that is not written (a
/// default, or set by the environment) gives the line of the deepest table that is.
pub fn line_of(text: &str, key: &str) -> Option<usize> {
    let doc = Document::parse(text).ok()?;
    let mut table: Option<&dyn TableLike> = Some(doc.as_table());
    let mut item: Option<&Item> = None;
    let mut span = None;
    for segment in segments(key)? {
        match segment {
            Segment::Key(name) => {
                let Some(next) = table.and_then(|t| t.get(&name)) else { break };
                span = next.span().or(span);
                table = next.as_table_like();
                item = Some(next);
            }
            Segment::Index(i) => {
                let Some(element) = item.and_then(Item::as_array_of_tables).and_then(|a| a.get(i)) else { break };
                span = element.span().or(span);
                table = Some(element);
                item = None;
            }
        }
    }
    span.map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
}

enum Segment {
    Key(String),
    Index(usize),
}

/// `routes[1].sink` → `routes`, 1, `sink`; quoted parts keep their dots.
fn segments(key: &str) -> Option<Vec<Segment>> {
    // `[N]` is not TOML key syntax: turn it into a quoted part, then let toml_edit parse.
    let mut rewritten = String::with_capacity(key.len() + 8);
    let mut in_quotes = false;
    for c in key.chars() {
        match c {
            '"' => in_quotes = !in_quotes,
            '[' if !in_quotes => {
                rewritten.push_str(".\"[");
                continue;
            }
            ']' if !in_quotes => {
                rewritten.push_str("]\"");
                continue;
            }
            _ => {}
        }
        rewritten.push(c);
    }
    let keys = Key::parse(&rewritten).ok()?;
    Some(
        keys.iter()
            .map(|k| {
                let name = k.get();
                match name.strip_prefix('[').and_then(|n| n.strip_suffix(']')).and_then(|n| n.parse().ok()) {
                    Some(i) => Segment::Index(i),
                    None => Segment::Key(name.to_string()),
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[kafka]\nbootstrap_servers = \"b:1\"\n\n[kafka.connection]\n\"sasl.password\" = \"x\"\n\n\
                        [[routes]]\ntypes = [\"a\"]\nsink = \"s\"\n\n[[routes]]\ntypes = [\"b\"]\nsink = \"t\"\n";

    #[test]
    fn keys_are_found_on_their_lines() {
        assert_eq!(line_of(TEXT, "kafka.bootstrap_servers"), Some(2));
        assert_eq!(line_of(TEXT, "kafka.connection.\"sasl.password\""), Some(5));
        assert_eq!(line_of(TEXT, "routes[1].sink"), Some(13));
        assert_eq!(line_of(TEXT, "routes[0].types"), Some(8));
    }

    #[test]
    fn an_unwritten_key_points_at_its_table_or_nowhere() {
        assert_eq!(line_of(TEXT, "kafka.group_id"), Some(1));
        assert_eq!(line_of(TEXT, "store.path"), None);
        assert_eq!(line_of("not toml [", "kafka"), None);
    }
}

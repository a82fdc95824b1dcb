//! `resolve --where ...` and `forget --where ...`: one operator action on every key a filter
//! matches (the filters of `dedupd keys`). The count comes first, on stderr; nothing changes
//! without `--yes`. Each key then goes through the single-key action, on the stopped store
//! or through the admin API (so each is refused or allowed as it would be alone, with
//! `store.changelog` by the instance that owns it), and prints one JSON line: the key and
//! what became of it.

use clap::Args;
use serde_json::{Value, json};

use super::output::{print_error, print_line};
use super::{CliError, Conn, ResolveAs};
use crate::store::{Completion, KeysQuery};

/// `--where FIELD=VALUE ...` and `--yes`.
#[derive(Debug, Clone, Default, Args)]
pub struct Bulk {
    /// Act on every key matching these filters instead of one key: FIELD=VALUE, FIELD one
    /// of state, route, sink, since, until, as `dedupd keys` takes them; repeat for more.
    #[arg(long = "where", value_name = "FIELD=VALUE", id = "filters")]
    pub filters: Vec<String>,
    /// With --where: act. Without it, only the number of matching keys is printed.
    #[arg(long, requires = "filters")]
    pub yes: bool,
}

impl Bulk {
    /// The filter the `--where`s say, or the first thing wrong with them.
    fn query(&self) -> Result<KeysQuery, CliError> {
        let mut pairs = std::collections::BTreeMap::new();
        for filter in &self.filters {
            let bad = |why: &str| CliError::Other(format!("--where {filter}: {why}"));
            let (field, value) = filter.split_once('=').ok_or_else(|| bad("not FIELD=VALUE"))?;
            let field = field.trim();
            if !KeysQuery::FIELDS.contains(&field) {
                return Err(bad(&format!("FIELD is one of {}", KeysQuery::FIELDS.join(", "))));
            }
            if pairs.insert(field.to_string(), value.to_string()).is_some() {
                return Err(bad("given twice"));
            }
        }
        let query = KeysQuery::from_pairs(pairs).map_err(|e| CliError::Other(format!("--where: {e}")))?;
        query.filter().map_err(|e| CliError::Other(format!("--where {e}")))?;
        Ok(query)
    }
}

/// The keys matching `query`, announced on stderr; empty unless `yes` (nothing to act on).
async fn matching(conn: &Conn, query: &KeysQuery, yes: bool, action: &str) -> Result<Vec<String>, CliError> {
    let keys = match conn {
        Conn::Direct(d) => d.store.matching_keys(&query.filter().map_err(CliError::Other)?)?,
        Conn::Remote(r) => super::keys::keys_remote(r, query).await?,
    };
    if yes {
        print_error(format_args!("{} key(s) match: {action} each", keys.len()));
        Ok(keys)
    } else {
        print_error(format_args!("{} key(s) match; nothing changed: add --yes to {action} them", keys.len()));
        Ok(Vec::new())
    }
}

/// Prints what became of `key`; returns whether it was done.
fn report(key: &str, done: Result<Value, CliError>) -> Result<bool, CliError> {
    let (line, ok) = match done {
        Ok(mut line) => {
            line["key"] = json!(key);
            (line, true)
        }
        Err(e) => (json!({"key": key, "error": e.to_string()}), false),
    };
    print_line(line)?;
    Ok(ok)
}

/// The end: exit 2 when any key was not done (each said why on its line).
fn finish(done: usize, of: usize) -> Result<(), CliError> {
    print_error(format_args!("done for {done} of {of} key(s)"));
    if done == of { Ok(()) } else { Err(CliError::Other(format!("{} key(s) not done: see their lines", of - done))) }
}

/// `forget --where ... [--force] [--yes]`.
pub async fn forget(conn: Conn, bulk: &Bulk, force: bool) -> Result<(), CliError> {
    let keys = matching(&conn, &bulk.query()?, bulk.yes, "forget").await?;
    let mut done = 0;
    for key in &keys {
        let was = match &conn {
            Conn::Direct(d) => d.forget(key, force),
            Conn::Remote(r) => r.forget(key, force).await,
        };
        done += usize::from(report(key, was.map(|was| json!({"forgot": true, "was": was})))?);
    }
    finish(done, keys.len())
}

/// `resolve --where ... --as succeeded|failed|--check [--yes]`: indeterminate keys only.
pub async fn resolve(conn: Conn, bulk: &Bulk, outcome: Option<ResolveAs>, check: bool) -> Result<(), CliError> {
    let mut query = bulk.query()?;
    match query.state.as_deref() {
        None | Some("indeterminate") => query.state = Some("indeterminate".into()),
        Some(other) => {
            return Err(CliError::Other(format!("--where state={other}: resolve settles indeterminate keys only")));
        }
    }
    let outcome = match (outcome, check) {
        (_, true) => None,
        (Some(outcome), false) => Some(Completion::from(outcome)),
        (None, false) => return Err(CliError::Other("resolve takes --as succeeded|failed or --check".into())),
    };
    let keys = matching(&conn, &query, bulk.yes, "resolve").await?;
    let mut done = 0;
    for key in &keys {
        let settled = match (&conn, outcome) {
            (Conn::Direct(d), Some(outcome)) => d.resolve(key, outcome),
            (Conn::Remote(r), Some(outcome)) => r.resolve(key, outcome).await,
            (Conn::Direct(d), None) => d.resolve_by_check(key).await,
            (Conn::Remote(r), None) => r.resolve_by_check(key).await,
        };
        // One line per key: what a check answered, and the state and outcome now.
        let line = settled.map(|v| {
            let record = v.get("record").unwrap_or(&v);
            json!({"check": v.get("check"), "state": record["state"], "outcome": record["outcome"]})
        });
        done += usize::from(report(key, line)?);
    }
    finish(done, keys.len())
}

//! wal2json format-version 2 records, read into [`Record`]s.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::record::{Record, RowChange, Value};

/// The plugin options every peek uses (before an optional `add-tables`).
pub(crate) const OPTIONS: [&str; 10] = [
    "format-version",
    "2",
    "include-transaction",
    "true",
    "include-xids",
    "true",
    "include-lsn",
    "true",
    "include-types",
    "false",
];

#[derive(Deserialize)]
struct RawRecord<'a> {
    action: String,
    #[serde(default)]
    xid: Option<u32>,
    #[serde(default)]
    schema: Option<String>,
    #[serde(default)]
    table: Option<String>,
    #[serde(default, borrow)]
    columns: Option<Vec<RawColumn<'a>>>,
    #[serde(default, borrow)]
    identity: Option<Vec<RawColumn<'a>>>,
}

#[derive(Deserialize)]
struct RawColumn<'a> {
    name: String,
    #[serde(borrow)]
    value: &'a RawValue,
}

fn value(raw: &RawValue) -> Result<Value, String> {
    let text = raw.get();
    if text == "null" {
        Ok(Value::Null)
    } else if text.starts_with('"') {
        serde_json::from_str::<String>(text)
            .map(Value::Text)
            .map_err(|e| format!("bad string value: {e}"))
    } else {
        // Numbers and booleans are printed verbatim from the type's output function.
        Ok(Value::Text(text.to_string()))
    }
}

fn columns(raw: Option<Vec<RawColumn<'_>>>) -> Result<Vec<(String, Value)>, String> {
    raw.unwrap_or_default()
        .into_iter()
        .map(|c| Ok((c.name, value(c.value)?)))
        .collect()
}

/// Parses one wal2json v2 record.
pub(crate) fn parse(data: &str) -> Result<Record, String> {
    let raw: RawRecord<'_> =
        serde_json::from_str(data).map_err(|e| format!("not a wal2json v2 record ({e})"))?;
    match raw.action.as_str() {
        "B" => Ok(Record::Begin(raw.xid)),
        "C" => Ok(Record::Commit),
        "I" | "U" | "D" | "T" => {
            let action = raw.action.chars().next().unwrap_or('?');
            let (Some(schema), Some(table)) = (raw.schema, raw.table) else {
                return Err(format!("{action} record without schema/table"));
            };
            Ok(Record::Change(RowChange {
                action,
                schema,
                table,
                columns: columns(raw.columns)?,
                identity: columns(raw.identity)?,
            }))
        }
        _ => Ok(Record::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_records() {
        assert_eq!(
            parse(r#"{"action":"B","lsn":"0/1"}"#).unwrap(),
            Record::Begin(None)
        );
        assert_eq!(
            parse(r#"{"action":"B","xid":741,"lsn":"0/1"}"#).unwrap(),
            Record::Begin(Some(741))
        );
        assert_eq!(parse(r#"{"action":"C"}"#).unwrap(), Record::Commit);
        assert_eq!(
            parse(r#"{"action":"M","prefix":"p","content":"x"}"#).unwrap(),
            Record::Other
        );
        let r = parse(
            r#"{"action":"U","lsn":"0/1929340","schema":"public","table":"docs","columns":[{"name":"id","value":"c"},{"name":"body","value":"{\"z\": null}"},{"name":"n","value":12.50},{"name":"x","value":null}],"identity":[{"name":"id","value":"a"}]}"#,
        )
        .unwrap();
        let Record::Change(c) = r else {
            panic!("not a change")
        };
        assert_eq!(c.action, 'U');
        assert_eq!(
            c.new_value("body"),
            Some(&Value::Text("{\"z\": null}".into()))
        );
        assert_eq!(c.new_value("n"), Some(&Value::Text("12.50".into())));
        assert_eq!(c.new_value("x"), Some(&Value::Null));
        assert!(c.moves_key());
        assert_eq!(c.width(), 2);
        assert!(parse("{").is_err());
        assert!(parse(r#"{"action":"I"}"#).is_err());
    }
}

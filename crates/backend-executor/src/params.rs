//! A run's configuration as parameters, one value each, for trackers that keep them
//! ([`RunEvent::RunStarted`](crate::RunEvent::RunStarted)): the scaling config and the run
//! config as their serde forms, flattened to dotted keys (`scaling.num_workers`,
//! `run.failure_config.max_failures`), each value a JSON scalar. The workers' environment is
//! left out: its values may be secret.

use serde_json::{Map, Value};
use trainyard_config::{RunConfig, ScalingConfig};

/// Fields of the run config that are not parameters.
const LEFT_OUT: &[&str] = &["env"];

/// The parameters of a run of `scaling` and `run`.
pub(crate) fn of(scaling: &ScalingConfig, run: &RunConfig) -> Map<String, Value> {
    let mut params = Map::new();
    if let Ok(value) = serde_json::to_value(scaling) {
        flatten("scaling", value, &mut params);
    }
    if let Ok(Value::Object(mut fields)) = serde_json::to_value(run) {
        for field in LEFT_OUT {
            fields.remove(*field);
        }
        flatten("run", Value::Object(fields), &mut params);
    }
    params
}

/// `value` under `key`: an object's fields as `key.field`, anything else whole (a list as
/// its JSON text); nulls are left out.
fn flatten(key: &str, value: Value, out: &mut Map<String, Value>) {
    match value {
        Value::Null => {}
        Value::Object(fields) => {
            for (field, value) in fields {
                flatten(&format!("{key}.{field}"), value, out);
            }
        }
        Value::Array(items) => {
            out.insert(
                key.to_owned(),
                Value::String(Value::Array(items).to_string()),
            );
        }
        scalar => {
            out.insert(key.to_owned(), scalar);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_flat_scalars_without_the_environment() {
        let scaling = ScalingConfig::default().num_workers(4);
        let run = RunConfig::default().name("p").env("TOKEN", "s3cret");
        let params = of(&scaling, &run);
        assert_eq!(params.get("scaling.num_workers"), Some(&Value::from(4)));
        assert_eq!(params.get("run.name"), Some(&Value::from("p")));
        assert!(
            params
                .values()
                .all(|v| !v.is_object() && !v.is_array() && !v.is_null())
        );
        assert!(
            !params.keys().any(|k| k.starts_with("run.env")),
            "{params:?}"
        );
        assert!(!Value::Object(params).to_string().contains("s3cret"));
    }
}

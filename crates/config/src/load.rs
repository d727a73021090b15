//! Reading configurations from TOML and JSON text and files.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::{ConfigError, RunConfig, ScalingConfig};

/// The text formats a configuration file may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// TOML (the default for files not ending in `.json`).
    Toml,
    /// JSON.
    Json,
}

impl Format {
    /// JSON for `*.json`, TOML otherwise.
    #[must_use]
    pub fn of_path(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("json") => Self::Json,
            _ => Self::Toml,
        }
    }

    const fn name(self) -> &'static str {
        match self {
            Self::Toml => "TOML",
            Self::Json => "JSON",
        }
    }

    /// Parses `text`; field-level checks run while deserialising, and unknown fields are
    /// errors that name the field and list the valid ones.
    ///
    /// # Errors
    /// [`ConfigError::Parse`].
    pub fn parse<T: DeserializeOwned>(
        self,
        text: &str,
        origin: Option<&Path>,
    ) -> Result<T, ConfigError> {
        let result = match self {
            Self::Toml => toml::from_str(text).map_err(|e| toml_reason(&e, text)),
            Self::Json => serde_json::from_str(text).map_err(|e| e.to_string()),
        };
        result.map_err(|reason| ConfigError::Parse {
            format: self.name(),
            origin: origin.map(Path::to_path_buf),
            reason,
        })
    }
}

/// The TOML parser's message on one line, with the position it points at.
fn toml_reason(error: &toml::de::Error, text: &str) -> String {
    let message = one_line(error.message());
    match error.span() {
        Some(span) => {
            let (line, column) = line_and_column(text, span.start);
            format!("{message} at line {line}, column {column}")
        }
        None => message,
    }
}

/// The non-empty lines of `text`, trimmed and joined with `, `.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The 1-based line and column (in characters) of byte `offset` in `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl ScalingConfig {
    /// Parses a file without the cross-field checks, so that command-line flags can still
    /// override fields before [`ScalingConfig::validate`].
    ///
    /// # Errors
    /// [`ConfigError::Read`] or [`ConfigError::Parse`].
    pub fn parse_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        Format::of_path(path).parse(&read(path)?, Some(path))
    }

    /// Reads and validates a TOML or JSON file (JSON when it ends in `.json`).
    ///
    /// # Errors
    /// Reading, parsing or validation errors.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let config = Self::parse_file(path)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses and validates TOML text.
    ///
    /// # Errors
    /// Parsing or validation errors.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let config: Self = Format::Toml.parse(text, None)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses and validates JSON text.
    ///
    /// # Errors
    /// Parsing or validation errors.
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        let config: Self = Format::Json.parse(text, None)?;
        config.validate()?;
        Ok(config)
    }
}

impl RunConfig {
    /// Reads and validates a TOML or JSON file (JSON when it ends in `.json`).
    ///
    /// # Errors
    /// Reading, parsing or validation errors.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let config: Self = Format::of_path(path).parse(&read(path)?, Some(path))?;
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_lines_and_characters_from_one() {
        let text = "a = 1\nbé = { x = \n";
        assert_eq!(line_and_column(text, 0), (1, 1));
        assert_eq!(line_and_column(text, 6), (2, 1));
        assert_eq!(line_and_column(text, text.find('{').unwrap()), (2, 6));
        assert_eq!(line_and_column(text, text.len() + 5), (3, 1));
    }
}

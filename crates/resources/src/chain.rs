//! [`ErrorChain`]: an error and its sources on one line.

use std::error::Error;
use std::fmt;

/// Displays an error followed by each of its sources: `outer: cause: root cause`.
///
/// Errors keep their cause in [`Error::source`] instead of repeating it in their message;
/// this is how such a chain is shown to a user on one line.
///
/// ```
/// use trainyard_resources::{ErrorChain, Resources};
///
/// let err = "CPU=-1".parse::<Resources>().unwrap_err();
/// assert_eq!(
///     ErrorChain(&err).to_string(),
///     "invalid amount for resource `CPU`: amount must not be negative, got -1"
/// );
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a dyn Error);

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

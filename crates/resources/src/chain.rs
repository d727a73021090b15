//! [`ErrorChain`]: an error and its sources on one line.

use std::error::Error;
use std::fmt;

/// Displays an error followed by each of its sources: `outer: cause: root cause`.
///
/// Errors keep their cause in [`Error::source`] instead of repeating it in their message;
/// this is how such a chain is shown to a user on one line. Some errors of other crates do
/// repeat their source's text in their own (an S3 error's body, say): a cause whose text is
/// already shown is not shown again, so each cause appears once.
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
        f.write_str(&chain_text(self.0.to_string(), self.0.source()))
    }
}

/// `shown` followed by each cause from `source` on, each after `: `. A cause's text that ends
/// with the text of one of its own causes (`Generic S3 error: <body>`, whose source is
/// `<body>`) is shown without that ending, as the cause comes next; a text already shown, or
/// left empty, is not shown again.
#[must_use]
pub fn chain_text(mut shown: String, source: Option<&(dyn Error + 'static)>) -> String {
    let mut causes = Vec::new();
    let mut next = source;
    while let Some(cause) = next {
        causes.push(cause.to_string());
        next = cause.source();
    }
    for (i, text) in causes.iter().enumerate() {
        let own = causes[i + 1..]
            .iter()
            .filter(|later| !later.is_empty())
            .find_map(|later| text.strip_suffix(later.as_str()))
            .unwrap_or(text)
            .trim_end_matches([':', ' ', '\n']);
        if !own.is_empty() && !shown.contains(own) {
            shown.push_str(": ");
            shown.push_str(own);
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a message and an optional source.
    #[derive(Debug)]
    struct Link(String, Option<Box<Link>>);

    impl fmt::Display for Link {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl Error for Link {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|link| link as &(dyn Error + 'static))
        }
    }

    fn link(text: &str, source: Option<Link>) -> Link {
        Link(text.to_owned(), source.map(Box::new))
    }

    #[test]
    fn each_cause_is_shown_once_even_when_an_error_repeats_its_source() {
        let body = "<Error><Code>NoSuchBucket</Code></Error>";
        let error = link(
            "cannot write run.json",
            Some(link(
                &format!("Generic S3 error: {body}"),
                Some(link(
                    &format!("response error: {body}"),
                    Some(link(body, None)),
                )),
            )),
        );
        let shown = ErrorChain(&error).to_string();
        assert_eq!(shown.matches(body).count(), 1, "{shown}");
        assert_eq!(
            shown,
            format!("cannot write run.json: Generic S3 error: response error: {body}")
        );
    }

    #[test]
    fn causes_with_their_own_text_are_all_shown() {
        let error = link("a", Some(link("b", Some(link("c", None)))));
        assert_eq!(ErrorChain(&error).to_string(), "a: b: c");
    }
}

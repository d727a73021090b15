//! Placement semantics shared by every runtime (to be written).

/// Why a placement group can never be scheduled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlacementError(pub String);

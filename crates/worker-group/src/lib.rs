//! A group of worker actors (being written).

//! Hardware backend (being written).

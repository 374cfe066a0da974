//! Shared helpers for the HLO conformance suite (stub).

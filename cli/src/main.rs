//! `peerless` CLI (stub).
fn main() {}

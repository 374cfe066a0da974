//! npz input/output in the CLI's naming scheme (stub).

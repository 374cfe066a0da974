//! Shared helpers for the interpreter tests.
#![allow(dead_code)]

use hlo::{Array, Element, Literal, Module};
use runs::{Mode, RunConfig};

pub fn parse(text: &str) -> Module {
    match hlo::parse_text("test.hlo", text) {
        Ok(m) => m,
        Err(e) => panic!("parse failed: {e}\n{text}"),
    }
}

pub fn cfg(n: usize, mode: Mode) -> RunConfig {
    RunConfig { num_devices: n, mode }
}

/// Runs with the same arguments on every device.
pub fn run_same(text: &str, n: usize, mode: Mode, args: Vec<Literal>) -> Vec<Literal> {
    let m = parse(text);
    interp::run(&m, &cfg(n, mode), &vec![args; n]).unwrap_or_else(|e| panic!("run failed: {e}"))
}

/// Runs a single-device module and returns its result.
pub fn run1(text: &str, args: Vec<Literal>) -> Literal {
    run_same(text, 1, Mode::Replica, args).remove(0)
}

pub fn run_err(text: &str, n: usize, mode: Mode, args: Vec<Vec<Literal>>) -> interp::InterpError {
    let m = parse(text);
    match interp::run(&m, &cfg(n, mode), &args) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e,
    }
}

pub fn arr<T: Element>(dims: &[i64], v: &[T]) -> Literal {
    Array::from_slice(dims.to_vec(), v).into()
}

pub fn vals<T: Element>(l: &Literal) -> Vec<T> {
    l.as_array().expect("array").to_vec::<T>().expect("element type")
}

pub fn tuple_vals<T: Element>(l: &Literal, i: usize) -> Vec<T> {
    match l {
        Literal::Tuple(t) => vals(&t[i]),
        _ => panic!("not a tuple: {l:?}"),
    }
}

pub fn dims(l: &Literal) -> Vec<i64> {
    l.as_array().expect("array").shape.dims.clone()
}

/// An f32 array whose values are `base + i` (row-major).
pub fn ramp(dims: &[i64], base: f32) -> Literal {
    let n: i64 = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|i| base + i as f32).collect();
    arr(dims, &v)
}

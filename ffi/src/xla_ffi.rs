//! XLA's typed FFI ("custom call" handlers): [`sys`], the C ABI (API version 0.4).

pub mod sys;

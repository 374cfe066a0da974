//! `PJRT_Error`: a boxed [`Error`] handed to the caller, who frees it with `PJRT_Error_Destroy`.

use std::fmt;

use pjrt_sys::PJRT_Error_Code as Code;
use pjrt_sys::{
    PJRT_Error_Code_PJRT_Error_Code_FAILED_PRECONDITION as FAILED_PRECONDITION,
    PJRT_Error_Code_PJRT_Error_Code_INTERNAL as INTERNAL,
    PJRT_Error_Code_PJRT_Error_Code_INVALID_ARGUMENT as INVALID_ARGUMENT,
    PJRT_Error_Code_PJRT_Error_Code_UNIMPLEMENTED as UNIMPLEMENTED,
};

/// An error crossing the C boundary: a PJRT status code and a message.
#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    pub code: Code,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error { code, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(INVALID_ARGUMENT, message)
    }
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(UNIMPLEMENTED, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL, message)
    }
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(FAILED_PRECONDITION, message)
    }

    /// Moves the error to the heap for the caller (`PJRT_Error_Destroy` frees it).
    pub fn into_raw(self) -> *mut pjrt_sys::PJRT_Error {
        Box::into_raw(Box::new(self)).cast()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

macro_rules! from_display {
    ($($t:ty => $code:ident),* $(,)?) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::new($code, format!("peerless: {e}"))
            }
        }
    )*};
}
from_display!(
    hlo::Error => INVALID_ARGUMENT,
    kernels::Error => INTERNAL,
    interp::InterpError => INVALID_ARGUMENT,
    prost::DecodeError => INVALID_ARGUMENT,
);

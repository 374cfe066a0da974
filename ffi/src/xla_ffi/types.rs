//! XLA FFI's enumerations as Rust enums: element types, error codes, execution stages (each keeps a value this table
//! does not know, from a newer XLA).

use std::fmt;

use super::sys;

/// Declares `$name`, the Rust enumeration of XLA's C enumeration `sys::$sys` (an `i32` newtype), with `from_raw` and
/// `to_raw`; `Unknown` keeps a value the table does not know (a newer XLA's).
macro_rules! open_enum {
    ($(#[$m:meta])* $name:ident($sys:ident) { $($v:ident = $raw:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($v,)*
            Unknown(i32),
        }

        impl $name {
            pub fn from_raw(t: sys::$sys) -> $name {
                match t {
                    $(sys::$sys::$raw => $name::$v,)*
                    sys::$sys(n) => $name::Unknown(n),
                }
            }

            pub fn to_raw(self) -> sys::$sys {
                match self {
                    $($name::$v => sys::$sys::$raw,)*
                    $name::Unknown(n) => sys::$sys(n),
                }
            }
        }
    };
}

macro_rules! data_types {
    ($($v:ident = $raw:ident, $name:literal, $bits:expr;)*) => {
        open_enum! {
            /// An element type. `Unknown` keeps a value this table does not know (a newer XLA's).
            #[allow(clippy::upper_case_acronyms)]
            DataType(XLA_FFI_DataType) { $($v = $raw),* }
        }

        impl DataType {
            /// XLA's spelling (`"f32"`, `"bf16"`, `"f8e4m3fn"`, ...); `"unknown"` for [`DataType::Unknown`].
            pub fn name(self) -> &'static str {
                match self {
                    $(DataType::$v => $name,)*
                    DataType::Unknown(_) => "unknown",
                }
            }

            /// Bits per element: 0 for token, `None` for invalid and unknown types.
            pub fn bit_width(self) -> Option<usize> {
                match self {
                    $(DataType::$v => $bits,)*
                    DataType::Unknown(_) => None,
                }
            }
        }
    };
}

data_types! {
    Invalid = INVALID, "invalid", None;
    Pred = PRED, "pred", Some(8);
    S1 = S1, "s1", Some(1);
    S2 = S2, "s2", Some(2);
    S4 = S4, "s4", Some(4);
    S8 = S8, "s8", Some(8);
    S16 = S16, "s16", Some(16);
    S32 = S32, "s32", Some(32);
    S64 = S64, "s64", Some(64);
    U1 = U1, "u1", Some(1);
    U2 = U2, "u2", Some(2);
    U4 = U4, "u4", Some(4);
    U8 = U8, "u8", Some(8);
    U16 = U16, "u16", Some(16);
    U32 = U32, "u32", Some(32);
    U64 = U64, "u64", Some(64);
    F16 = F16, "f16", Some(16);
    F32 = F32, "f32", Some(32);
    F64 = F64, "f64", Some(64);
    BF16 = BF16, "bf16", Some(16);
    C64 = C64, "c64", Some(64);
    C128 = C128, "c128", Some(128);
    Token = TOKEN, "token", Some(0);
    F8E5M2 = F8E5M2, "f8e5m2", Some(8);
    F8E3M4 = F8E3M4, "f8e3m4", Some(8);
    F8E4M3 = F8E4M3, "f8e4m3", Some(8);
    F8E4M3FN = F8E4M3FN, "f8e4m3fn", Some(8);
    F8E4M3B11FNUZ = F8E4M3B11FNUZ, "f8e4m3b11fnuz", Some(8);
    F8E5M2FNUZ = F8E5M2FNUZ, "f8e5m2fnuz", Some(8);
    F8E4M3FNUZ = F8E4M3FNUZ, "f8e4m3fnuz", Some(8);
    F4E2M1FN = F4E2M1FN, "f4e2m1fn", Some(4);
    F8E8M0FNU = F8E8M0FNU, "f8e8m0fnu", Some(8);
}

impl DataType {
    /// Bytes per element: `None` for sub-byte types (packed, see [`DataType::byte_len`]), invalid and unknown types;
    /// `Some(0)` for token.
    pub fn byte_width(self) -> Option<usize> {
        self.bit_width().filter(|b| b % 8 == 0).map(|b| b / 8)
    }

    /// Bytes `elements` elements occupy, sub-byte types packed (`ceil(elements * bits / 8)`); `None` for invalid and
    /// unknown types or on overflow.
    pub fn byte_len(self, elements: usize) -> Option<usize> {
        let bits = self.bit_width()?;
        Some(elements.checked_mul(bits)?.div_ceil(8))
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataType::Unknown(n) => write!(f, "unknown data type {n}"),
            t => f.write_str(t.name()),
        }
    }
}

// --------------------------------------------------------------------------------------------- Error codes, stages

macro_rules! error_codes {
    ($($v:ident = $raw:ident;)*) => {
        /// XLA's status codes (absl's canonical codes).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($v,)*
        }

        impl ErrorCode {
            /// A value outside the table becomes [`ErrorCode::Unknown`].
            pub fn from_raw(c: sys::XLA_FFI_Error_Code) -> ErrorCode {
                match c {
                    $(sys::XLA_FFI_Error_Code::$raw => ErrorCode::$v,)*
                    _ => ErrorCode::Unknown,
                }
            }

            pub fn to_raw(self) -> sys::XLA_FFI_Error_Code {
                match self {
                    $(ErrorCode::$v => sys::XLA_FFI_Error_Code::$raw,)*
                }
            }

            /// The code's name, as absl spells it (`INVALID_ARGUMENT`).
            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorCode::$v => stringify!($raw),)*
                }
            }
        }
    };
}

error_codes! {
    Ok = OK;
    Cancelled = CANCELLED;
    Unknown = UNKNOWN;
    InvalidArgument = INVALID_ARGUMENT;
    DeadlineExceeded = DEADLINE_EXCEEDED;
    NotFound = NOT_FOUND;
    AlreadyExists = ALREADY_EXISTS;
    PermissionDenied = PERMISSION_DENIED;
    ResourceExhausted = RESOURCE_EXHAUSTED;
    FailedPrecondition = FAILED_PRECONDITION;
    Aborted = ABORTED;
    OutOfRange = OUT_OF_RANGE;
    Unimplemented = UNIMPLEMENTED;
    Internal = INTERNAL;
    Unavailable = UNAVAILABLE;
    DataLoss = DATA_LOSS;
    Unauthenticated = UNAUTHENTICATED;
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

open_enum! {
    /// The stage a handler is called for.
    ExecutionStage(XLA_FFI_ExecutionStage) {
        Instantiate = INSTANTIATE,
        Prepare = PREPARE,
        Initialize = INITIALIZE,
        Execute = EXECUTE,
        Record = RECORD,
    }
}

//! GGUF metadata values: the thirteen on-disk value types, arrays (possibly nested) included.

use std::fmt;

/// On-disk id of a GGUF metadata value type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum GgufValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl GgufValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type occupies on disk (a string is at least its
    /// 8-byte length, an array at least its 4-byte element type and 8-byte count). Used to
    /// bound element counts by the bytes left in the file before allocating.
    pub fn min_size(self) -> u64 {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Elements all share the type recorded in the file; arrays may nest.
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// Any integer type that is non-negative, as u64.
    pub fn as_u64(&self) -> Option<u64> {
        use GgufValue::*;
        match *self {
            U8(v) => Some(v as u64),
            U16(v) => Some(v as u64),
            U32(v) => Some(v as u64),
            U64(v) => Some(v),
            I8(v) => u64::try_from(v).ok(),
            I16(v) => u64::try_from(v).ok(),
            I32(v) => u64::try_from(v).ok(),
            I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type that fits an i64.
    pub fn as_i64(&self) -> Option<i64> {
        use GgufValue::*;
        match *self {
            U8(v) => Some(v as i64),
            U16(v) => Some(v as i64),
            U32(v) => Some(v as i64),
            U64(v) => i64::try_from(v).ok(),
            I8(v) => Some(v as i64),
            I16(v) => Some(v as i64),
            I32(v) => Some(v as i64),
            I64(v) => Some(v),
            _ => None,
        }
    }

    /// A float, or an integer converted to f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => self.as_i64().map(|v| v as f32),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn value_type(&self) -> GgufValueType {
        use GgufValue::*;
        match self {
            U8(_) => GgufValueType::U8,
            I8(_) => GgufValueType::I8,
            U16(_) => GgufValueType::U16,
            I16(_) => GgufValueType::I16,
            U32(_) => GgufValueType::U32,
            I32(_) => GgufValueType::I32,
            F32(_) => GgufValueType::F32,
            Bool(_) => GgufValueType::Bool,
            String(_) => GgufValueType::String,
            Array(_) => GgufValueType::Array,
            U64(_) => GgufValueType::U64,
            I64(_) => GgufValueType::I64,
            F64(_) => GgufValueType::F64,
        }
    }
}

impl fmt::Display for GgufValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufValue::*;
        match self {
            U8(v) => write!(f, "{v}"),
            I8(v) => write!(f, "{v}"),
            U16(v) => write!(f, "{v}"),
            I16(v) => write!(f, "{v}"),
            U32(v) => write!(f, "{v}"),
            I32(v) => write!(f, "{v}"),
            F32(v) => write!(f, "{v}"),
            Bool(v) => write!(f, "{v}"),
            String(s) => write!(f, "{s:?}"),
            Array(a) => write!(f, "[{} values]", a.len()),
            U64(v) => write!(f, "{v}"),
            I64(v) => write!(f, "{v}"),
            F64(v) => write!(f, "{v}"),
        }
    }
}

//! The former home of [`Format`], now [`crate::config::Format`].
//!
//! Kept so that code written against `gray_core::format::Format` (gray-discovery's
//! instance file, until it moves to [`crate::config`]) still compiles.

pub use crate::config::Format;

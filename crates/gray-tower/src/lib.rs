//! Tower layers that carry a gray stain from every inbound request to every outbound call.

pub mod task;

pub use task::{ContextExt, current};

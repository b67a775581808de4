mod base;
mod client;
mod server;

pub use base::*;
pub use client::*;
pub use server::*;

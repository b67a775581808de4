mod base;
mod centralized;
mod op;
mod ring;
mod tree;

pub(crate) use base::*;
pub(crate) use centralized::*;
pub(crate) use op::*;
pub(crate) use ring::*;
pub(crate) use tree::*;

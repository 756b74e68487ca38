//! Consensus: openraft types, the peer network, the peer service, proposal forwarding and
//! bootstrap. Nothing outside this module and `storage::{log_store, state_machine}` imports
//! openraft; the MVCC, lease and watch logic sits behind the state machine's apply.

pub mod append_pipeline;
pub mod append_serve;
pub mod append_stream;
#[cfg(test)]
mod append_stream_tests;
pub mod batcher;
pub mod bootstrap;
pub mod forward;
pub mod identity;
pub mod leader_contact;
pub mod member_tasks;
pub mod membership;
pub mod network;
pub mod proposer;
pub mod read_index;
pub mod relay;
pub mod relay_serve;
#[cfg(test)]
mod relay_tests;
pub mod service;
pub mod snapshot_data;
pub mod snapshot_pace;
pub mod snapshot_transfer;
pub mod transfer;
pub mod types;
pub mod vote_hold;
#[cfg(test)]
mod vote_hold_tests;

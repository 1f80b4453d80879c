//! What the report computes from what `reading/` hands it, in one pass: the aggregates of
//! the system ticks and timeline events ([`collect`]), the step statistics per mode
//! ([`steps`]), the detailed windows ([`detailed`]), the collectives across ranks and the nodes' clocks
//! aligned from them ([`collectives`]), the fleet view ([`fleet`]), the hang and
//! crash incidents ([`incidents`]), what profiling cost ([`cost`]) and the statistics they share ([`stats`]). What it
//! produces is the model's vocabulary (`model/`); the rules (`rules/`) judge its aggregates.

pub mod collect;
pub mod collectives;
pub mod cost;
pub mod detailed;
pub mod fleet;
pub mod incidents;
pub mod inspector;
pub mod memory;
pub mod memory_events;
pub mod stats;
pub mod steps;

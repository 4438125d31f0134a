//! The side-by-side benchmark behind `tidemark bench` (the binary `tidemark-bench`, `main.rs`)
//! and what tidemark's own benchmarks in `benches/benches/` share with it: [`events`] (what every
//! system appends), [`targets`] (one [`targets::Target`] per system), [`peers`] (starting and
//! stopping servers), [`workloads`] (append cells, closed-loop or windowed), [`filled`] (read-back, growth),
//! [`cluster_reads`] (reads from one and two nodes on a cluster), [`sse`], [`reopen`],
//! [`measure`] (percentiles, /proc counters, strace), [`http`] (the requests made of a tidemark server), [`layers`] (the server's CPU by layer), [`machine`] (the machine and its fsync
//! latency), [`journal_write`] (the ways a journal record can be made durable), [`report`] (tables and ratios).

pub mod cluster_reads;
pub mod deliver;
pub mod events;
pub mod filled;
pub mod http;
pub mod idle;
pub mod journal_write;
pub mod layers;
pub mod machine;
pub mod measure;
pub mod peers;
pub mod queue;
pub mod reopen;
pub mod report;
pub mod sse;
pub mod targets;
pub mod workloads;

//! The delivery workers' own runtime, whose threads run at a lower CPU priority than the rest
//! of the hub. When fan-out keeps every core busy, the HTTP side (a source's publish waiting
//! for its 202, a subscriber reading the topic) still gets the CPU first; delivery takes what
//! is left, which is all of it when nothing else runs. Measured with `bash scripts/bench.sh`
//! (1,000 subscribers, two cores): a publish's 202 p99 went from 26–57 ms to under 5 ms
//! (BENCHMARKS.md has the run). A worker also gives its core away between two steps
//! ([`give_way`]), as a lower priority alone does not take a core from a running thread
//! before the next scheduler tick.

use tokio::runtime::{Builder, Handle, Runtime};

/// How much nicer than the rest of the hub delivery threads are (Linux nice values: 0 is
/// normal, 19 the lowest priority). At 10 the scheduler gives an ingest thread about nine
/// tenths of a core that both want.
const NICENESS: i32 = 10;

/// A multi-thread runtime for the delivery workers and the batchers that wake them: one
/// thread per two cores (at least one). On two cores one thread measured less CPU per
/// delivery than two (38 against 51 µs at 1,000 subscribers, one bench run each) and leaves
/// the other core to ingest. Two threads at normal priority deliver more when the receiver
/// shares the machine (0.52–0.59 of `wrk` at 1,000 subscribers against 0.38–0.42), but a
/// publish's 202 p99 then rises from 4–5 ms to 6–9 ms; docs/performance.md has the runs.
pub struct DeliveryRuntime {
    runtime: Option<Runtime>,
}

impl DeliveryRuntime {
    /// `None` (with a warning) when the runtime cannot be made: workers then run on the hub's
    /// own runtime.
    pub fn start() -> Option<DeliveryRuntime> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let built = Builder::new_multi_thread()
            .worker_threads((cores / 2).max(1))
            .thread_name("changehub-delivery")
            .on_thread_start(lower_priority)
            .enable_all()
            .build();
        match built {
            Ok(runtime) => Some(DeliveryRuntime {
                runtime: Some(runtime),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the delivery threads; delivering on the hub's own");
                None
            }
        }
    }

    /// Where to spawn a worker (`None` only while the runtime is being dropped).
    pub fn handle(&self) -> Option<&Handle> {
        self.runtime.as_ref().map(Runtime::handle)
    }
}

impl Drop for DeliveryRuntime {
    /// Without waiting for its tasks (the hub stops them first): dropping a runtime may happen
    /// inside another runtime, where blocking is not allowed.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// How long a delivery thread runs before it lets a waiting thread of the hub go first.
const GIVE_WAY_EVERY: std::time::Duration = std::time::Duration::from_micros(250);

thread_local! {
    static LAST_GAVE_WAY: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// Called by a delivery worker between two steps: at most every [`GIVE_WAY_EVERY`], lets any
/// thread waiting for this core run first (`sched_yield`), and goes on at once when none
/// waits. A lower priority alone does not do it: Linux lets a running thread finish its time
/// slice (up to a scheduler tick, 4 ms at 250 Hz) before a thread it woke or that woke beside
/// it gets the core, and a publish's 202 waited that long behind busy delivery threads.
pub fn give_way() {
    let now = std::time::Instant::now();
    LAST_GAVE_WAY.with(|last| match last.get() {
        Some(at) if now.duration_since(at) < GIVE_WAY_EVERY => {}
        _ => {
            last.set(Some(now));
            yield_core();
        }
    });
}

#[cfg(target_os = "linux")]
fn yield_core() {
    // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
    unsafe {
        libc::sched_yield();
    }
}

#[cfg(not(target_os = "linux"))]
fn yield_core() {}

/// Lowers the calling thread's priority (on Linux the nice value belongs to the thread).
#[cfg(target_os = "linux")]
fn lower_priority() {
    // SAFETY: setpriority takes no pointers; with PRIO_PROCESS and 0 it changes only the
    // calling thread's nice value. A failure leaves the priority as it was, which is harmless.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICENESS) };
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

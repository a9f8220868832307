//! Memory the hub holds by itself, counted by this test binary's own global allocator (a
//! binary of its own, so that no other test's allocations are counted).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use common::{wait_until, TestHub};

/// The system allocator, counting the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

const MIB: isize = 1 << 20;

/// A histogram keeps each value recorded until the values are folded into its buckets. A
/// scrape of `/metrics` does that; a hub that nobody scrapes must do it by itself, or it grows
/// by 8 bytes per append and per delivery for as long as it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_histogram_values_are_let_go_without_a_scrape() {
    let hub = TestHub::start(|_| {}).await;
    hub.push("warm", 1).await;
    let before = live();
    // What a million appends record (ingest records each one's time in this histogram).
    // The most held is read as they are recorded: the hub folds them every second, so on a
    // slow machine some may be let go before the last is recorded.
    const VALUES: usize = 1_000_000;
    let mut held = 0;
    for i in 0..VALUES {
        metrics::histogram!("changehub_store_append_seconds").record(0.001);
        if i % 10_000 == 0 {
            held = held.max(live() - before);
        }
    }
    assert!(
        held > 4 * MIB,
        "the values should be held until they are folded: {held} bytes at most"
    );
    // Traffic goes on meanwhile, as in a hub at work: the exporter frees the blocks of folded
    // values through epoch-based reclamation, which runs as values are recorded (an idle
    // hub lets them go later).
    wait_until(
        "the recorded values to be folded into the buckets and freed",
        Duration::from_secs(20),
        || async {
            for _ in 0..1_000 {
                metrics::histogram!("changehub_store_append_seconds").record(0.001);
            }
            live() - before < 2 * MIB
        },
    )
    .await;
    // Folded, not lost: the scrape counts every value.
    let text = hub.text("/metrics").await;
    let count: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("changehub_store_append_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the append histogram's count");
    assert!(
        count > VALUES as f64,
        "every recorded value is counted: {count}"
    );
}

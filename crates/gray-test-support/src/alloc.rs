//! A global allocator that counts the allocations (and reallocations) of each thread.
//!
//! A test binary installs it and measures a closure on its own thread (the harness's other
//! threads do not disturb the count):
//!
//! ```
//! use gray_test_support::alloc::{Counting, measure};
//!
//! #[global_allocator]
//! static ALLOCATOR: Counting = Counting;
//!
//! let ((), n) = measure(|| {});
//! assert_eq!(n, 0);
//! let (v, n) = measure(|| vec![1u8; 16]);
//! assert_eq!((v.len(), n), (16, 1));
//! ```

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

/// `System`, counting the allocations (and reallocations) made by each thread. Install it
/// with `#[global_allocator]`; read the count with [`allocations`] or [`measure`].
#[derive(Debug, Clone, Copy)]
pub struct Counting;

thread_local! {
    // Const-initialised and without a destructor: touching it never allocates.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn note_allocation() {
    // `try_with`: the thread may be tearing its thread-locals down.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counting touches only a const-initialised thread-local `Cell` and never allocates.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded unchanged; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: as above; `ptr` was allocated by `System` through this wrapper.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The allocations the current thread made so far (only counted while [`Counting`] is the
/// global allocator).
pub fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

/// The allocations the current thread makes while running `f` once.
pub fn allocations_in<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = allocations();
    let out = f();
    (out, allocations() - before)
}

/// Runs `f` eight times to warm up (first-use thread-locals, one-time promotions), then
/// returns its result and the allocations the current thread made during one more run.
pub fn measure<R>(mut f: impl FnMut() -> R) -> (R, usize) {
    for _ in 0..8 {
        drop(f());
    }
    allocations_in(f)
}

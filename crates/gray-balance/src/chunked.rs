//! A vector in shared chunks: cloning it copies one pointer per chunk, and changing an
//! element copies only its chunk when a clone still holds it.
//!
//! The background task changes the subset index and publishes a clone of it; requests
//! read the published clone. With 10,000 endpoints a change then copies about 80 chunk
//! pointers and one or two chunks of 128 elements, not 10,000 elements.

use std::sync::Arc;

const SHIFT: u32 = 7;
/// Elements per chunk.
const CHUNK: usize = 1 << SHIFT;
const MASK: usize = CHUNK - 1;

#[derive(Debug)]
pub(crate) struct Chunked<T> {
    chunks: Vec<Arc<Vec<T>>>,
    len: usize,
}

impl<T> Clone for Chunked<T> {
    fn clone(&self) -> Self {
        Chunked {
            chunks: self.chunks.clone(),
            len: self.len,
        }
    }
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Chunked<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i >> SHIFT)?.get(i & MASK)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|c| c.iter())
    }
}

impl<T: Clone> Chunked<T> {
    /// The element at `i`, for writing; copies its chunk if a clone shares it.
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if i >= self.len {
            return None;
        }
        Arc::make_mut(&mut self.chunks[i >> SHIFT]).get_mut(i & MASK)
    }

    pub(crate) fn push(&mut self, value: T) {
        if self.len & MASK == 0 {
            self.chunks.push(Arc::new(Vec::with_capacity(CHUNK)));
        }
        if let Some(last) = self.chunks.last_mut() {
            Arc::make_mut(last).push(value);
            self.len += 1;
        }
    }

    pub(crate) fn pop(&mut self) -> Option<T> {
        let last = self.chunks.last_mut()?;
        let value = Arc::make_mut(last).pop();
        if last.is_empty() {
            self.chunks.pop();
        }
        if value.is_some() {
            self.len -= 1;
        }
        value
    }

    /// Removes the element at `i`, moving the last one into its place (unless it was the
    /// last). Returns the removed element.
    pub(crate) fn swap_remove(&mut self, i: usize) -> Option<T> {
        if i >= self.len {
            return None;
        }
        let last = self.pop()?;
        if i == self.len {
            return Some(last);
        }
        self.get_mut(i).map(|slot| std::mem::replace(slot, last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_like_a_vec_and_shares_untouched_chunks() {
        let mut c = Chunked::default();
        let mut v = Vec::new();
        for i in 0..1_000u32 {
            c.push(i);
            v.push(i);
        }
        let before = c.clone();
        for i in [0usize, 5, 500, 996, 990] {
            assert_eq!(c.swap_remove(i), Some(v.swap_remove(i)));
        }
        assert_eq!(c.swap_remove(10_000), None);
        *c.get_mut(3).unwrap() = 7;
        v[3] = 7;
        assert_eq!(c.iter().copied().collect::<Vec<_>>(), v);
        assert_eq!(c.len(), v.len());
        // The clone taken before is untouched, and shares the chunks nobody wrote.
        assert_eq!(before.len(), 1_000);
        assert_eq!(
            before.iter().copied().collect::<Vec<_>>(),
            (0..1_000).collect::<Vec<_>>()
        );
        assert!(Arc::ptr_eq(&before.chunks[2], &c.chunks[2]));
        assert!(!Arc::ptr_eq(&before.chunks[0], &c.chunks[0]));
        while c.pop().is_some() {}
        assert_eq!((c.len(), c.chunks.len()), (0, 0));
    }
}

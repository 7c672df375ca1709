//! Ids this process is doing something for now (a task or a batch it is submitting), each
//! marked for as long as its guard lives: whoever finds an id in that state and not marked
//! here knows the process that was doing it stopped.

use std::collections::HashSet;
use std::sync::Mutex;

#[derive(Default)]
pub struct Marks(Mutex<HashSet<String>>);

/// An id's mark, taken off when dropped.
pub struct Marked<'a> {
    marks: &'a Marks,
    id: String,
}

impl Marks {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Mark `id` until the guard is dropped.
    pub fn mark(&self, id: &str) -> Marked<'_> {
        self.set().insert(id.to_string());
        Marked { marks: self, id: id.to_string() }
    }

    pub fn contains(&self, id: &str) -> bool {
        self.set().contains(id)
    }
}

impl Drop for Marked<'_> {
    fn drop(&mut self) {
        self.marks.set().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_marked_while_its_guard_lives() {
        let marks = Marks::default();
        let guard = marks.mark("task_1");
        assert!(marks.contains("task_1") && !marks.contains("task_2"));
        drop(guard);
        assert!(!marks.contains("task_1"));
    }
}

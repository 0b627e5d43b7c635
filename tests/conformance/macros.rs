/// A fresh test bed from the runner, or an early return when the backend is unavailable (the
/// runner has printed why).
macro_rules! bed {
    () => {
        match crate::bed::new_bed() {
            Some(bed) => bed,
            None => return,
        }
    };
}
